"""top's numbers: rates between two readings, and n/a (None, with the reason) where a backend gives none."""

from __future__ import annotations

import httpx

from muse_launch.plan.spec import Probe, ProbeKind
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import DeploymentRecord, RoleRecord
from muse_launch.top.collect import Reading, metrics_url, read_role, role_row, router_loads, snapshot


def role(name="decode", engine="sglang", kind="decode", ports=None, state=RoleState.READY, url=None):
    ports = {"http": 30002} if ports is None else ports
    return RoleRecord(
        name,
        kind,
        state,
        (),
        url or (f"http://127.0.0.1:{ports['http']}" if "http" in ports else None),
        ports,
        Probe(ProbeKind.HTTP, ("/health",)),
        "127.0.0.1",
        "SIGTERM",
        1.0,
        engine=engine,
    )


def reading(at, **values):
    return Reading(at, "http://127.0.0.1:30002/metrics", values)


def test_rates_and_ttft_between_two_readings():
    before = reading(
        10.0,
        running=1,
        queued=0,
        kv_cache_usage=0.5,
        prompt_tokens=100,
        generation_tokens=1000,
        ttft_sum=1.0,
        ttft_count=10,
    )
    now = reading(
        12.0,
        running=3,
        queued=2,
        kv_cache_usage=0.25,
        prompt_tokens=300,
        generation_tokens=5000,
        ttft_sum=1.6,
        ttft_count=13,
    )
    row = role_row(role(), now, before, "ok")
    assert row["prompt_tokens_per_s"] == 100.0 and row["generation_tokens_per_s"] == 2000.0
    assert abs(row["ttft_s"] - 0.2) < 1e-9 and row["ttft_idle"] is False
    assert (row["running"], row["queued"], row["kv_cache_usage"], row["health"]) == (3, 2, 0.25, "ok")


def test_first_reading_has_no_rates_and_a_restart_gives_none_not_a_negative_rate():
    first = role_row(role(), reading(1.0, prompt_tokens=50, generation_tokens=50), None, "ok")
    assert first["prompt_tokens_per_s"] is None and first["prompt_tokens_total"] == 50
    restarted = role_row(
        role(),
        reading(2.0, prompt_tokens=5, generation_tokens=5, ttft_sum=0.1, ttft_count=1),
        reading(1.0, prompt_tokens=50, generation_tokens=50, ttft_sum=9.0, ttft_count=90),
        "ok",
    )
    assert restarted["prompt_tokens_per_s"] is None and restarted["generation_tokens_per_s"] is None
    assert restarted["ttft_s"] is None


def test_a_metric_the_engine_lacks_is_none_not_zero():
    row = role_row(
        role(),
        reading(2.0, running=None, prompt_tokens=None, generation_tokens=7),
        reading(1.0, running=None, prompt_tokens=None, generation_tokens=7),
        "ok",
    )
    assert row["running"] is None and row["prompt_tokens_per_s"] is None
    assert row["generation_tokens_per_s"] == 0.0  # known, and nothing was generated
    assert row["ttft_s"] is None and row["ttft_idle"] is False  # no TTFT metric at all: n/a, not idle


def test_where_metrics_are_or_why_there_are_none():
    assert metrics_url(role()) == ("http://127.0.0.1:30002/metrics", None)
    assert metrics_url(role("router", "sglang-router", "router", {"http": 8000, "metrics": 29000})) == (
        "http://127.0.0.1:29000/metrics",
        None,
    )
    assert metrics_url(role("r", "vllm-router", "router", {"http": 8000}))[1] == "no metrics port"
    assert metrics_url(role("job", "command", "command", {"http": 9000}))[1] == "command exposes no metrics"
    assert metrics_url(role("w@n1", "vllm", "worker", {}))[1] == "serves no HTTP (a node rank past 0)"


def test_a_role_not_running_is_not_read():
    with httpx.Client() as client:
        got = read_role(role(state=RoleState.FAILED), client)
    assert got.error == "not running (failed)" and got.values == {}


def test_router_workers_are_named_by_role_and_a_stranger_is_kept():
    decode = role()
    router = role("router", "sglang-router", "router", {"http": 8000, "metrics": 29000})
    record = DeploymentRecord("d", "f.yaml", (), (decode, router))
    readings = {
        "decode": reading(1.0),
        "router": Reading(
            1.0,
            "u",
            {"requests": 5},
            workers={
                "http://127.0.0.1:30002": {"load": 4.0, "healthy": 1.0},
                "http://10.9.9.9:1": {"load": None, "healthy": 0.0},
            },
        ),
    }
    loads = router_loads(record, readings)
    assert loads[0]["workers"] == [
        {"url": "http://127.0.0.1:30002", "role": "decode", "load": 4, "healthy": True},
        {"url": "http://10.9.9.9:1", "role": None, "load": None, "healthy": False},
    ]
    snap = snapshot(record, readings, None, {"decode": "ok", "router": None}, 1.0)
    assert [r["name"] for r in snap["roles"]] == ["decode", "router"] and snap["routers"][0][
        "router"
    ] == "router"
    assert snap["roles"][1]["requests_per_s"] is None and snap["roles"][1]["in_flight"] == 4


def test_the_table_says_n_a_for_none_and_shows_zero_as_zero():
    from rich.console import Console

    from muse_launch.top.view import render

    zero = reading(
        2.0,
        running=0,
        queued=0,
        kv_cache_usage=0.0,
        prompt_tokens=0,
        generation_tokens=0,
        ttft_sum=0.0,
        ttft_count=0,
    )
    lacking = Reading(
        2.0, "http://127.0.0.1:30003/metrics", error="no /metrics: sglang serves it with --enable-metrics"
    )
    record = DeploymentRecord("d", "f.yaml", (), (role("idle"), role("dark", ports={"http": 30003})))
    snap = snapshot(
        record,
        {"idle": zero, "dark": lacking},
        {"idle": reading(1.0, prompt_tokens=0, generation_tokens=0, ttft_sum=0.0, ttft_count=0)},
        {"idle": "ok", "dark": "ok"},
        1.0,
    )
    console = Console(width=220, record=True)
    console.print(render(snap))
    lines = {
        line.split("\u2502")[1].strip(): [c.strip() for c in line.split("\u2502")[1:-1]]
        for line in console.export_text().splitlines()
        if line.count("\u2502") > 10
    }
    # known zeros, and no new first token (TTFT and ITL: "-")
    assert lines["idle"][5:12] == ["0", "0", "0.0%", "0.0", "0.0", "-", "-"]
    assert lines["dark"][5:12] == ["n/a"] * 7
    assert lines["dark"][12].startswith("no /metrics: sglang serves it with")
