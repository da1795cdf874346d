"""`bench`, its validity gate, `bench compare`, `--check-equivalence` and `sweep`, with the real aiperf
against
the real sglang-router in front of the simulated engine, and against a misbehaving server (a stand-in that
sends an SSE error event before [DONE], a 500, no tokens, too few, or miscounts)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness import REPO, Deployment, free_ports

pytestmark = [pytest.mark.bench, pytest.mark.integration, pytest.mark.rehearsal]

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
BAD = str(REPO / "tests" / "stand_ins" / "bad_openai.py")
POINT = ["--isl", "64", "--osl", "16", "--duration", "60"]
TOP = {"hardware": "b300", "model": M, "engine": "sglang", "rehearse": {"ready_after": 0.3}}


# a second deployment on the rehearsal's one 8-GPU host, beside the first (as it would be on a second host):
# `up` refuses GPUs another deployment holds, unless told not to read them
BESIDE = ("--skip-gpu-check",)


def agg_roles(worker: int, router: int) -> dict:
    return {
        "worker": {"kind": "worker", "gpus": "0-7", "tp": 8, "port": worker},
        "router": {"kind": "router", "port": router, "metrics_port": free_ports(1)[0], "workers": ["worker"]},
    }


def pd_roles(prefill: int, decode: int, bootstrap: int, router: int) -> dict:
    return {
        "prefill": {"kind": "prefill", "gpus": "0-3", "tp": 4, "port": prefill, "bootstrap_port": bootstrap},
        "decode": {"kind": "decode", "gpus": "4-7", "tp": 4, "port": decode, "bootstrap_port": bootstrap},
        "router": {
            "kind": "router",
            "port": router,
            "metrics_port": free_ports(1)[0],
            "prefill": ["prefill"],
            "decode": ["decode"],
        },
    }


def up(d: Deployment, path: Path, *more: str) -> None:
    r = d.cli("up", path, "-d", "--rehearse", *more, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def down(d: Deployment) -> None:
    r = d.cli("down", d.name, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not d.alive()


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_bench_of_a_rehearsal_is_valid_recorded_and_labelled_simulated(deployment, tmp_path):
    d = deployment
    up(d, d.write(agg_roles(*free_ports(2)), **TOP))
    try:
        run = tmp_path / "run"
        args = ("bench", d.name, "--concurrency", "1,4", "--requests", "8", *POINT, "--out", run)
        r = d.cli(*args, "--slo", "ttft=60s,itl=10s", timeout=400)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "SIMULATED" in r.stdout and "concurrency    4" in r.stdout and "\nvalid" in r.stdout
        assert "TTFT p50/p90/p99/max" in r.stdout and "good tok/s/GPU" in r.stdout
        s = summary(run)
        assert s["verdict"] in ("valid", "valid, client-limited") and s["command"].startswith(
            "muse-launch bench"
        )
        for p in s["points"]:  # targets every request meets: goodput is the raw throughput
            g = p["goodput"]
            assert g["requests_measured"] == g["requests_good"] == 8 and g["meets_slo"] is True
            assert g["output_tokens_per_s"] > 0 and p["e2e_ms"]["p99"] >= p["e2e_ms"]["p50"] > 0
            assert p["ttft_ms"]["max"] >= p["ttft_ms"]["p90"] >= p["ttft_ms"]["p50"]
        again = d.cli(*args, timeout=60)  # a second run into the same record would mix their points
        assert again.returncode == 2 and "already holds a bench record" in again.stderr
        assert s["valid"] is True and s["reasons"] == [] and s["simulated"] is True
        assert [p["concurrency"] for p in s["points"]] == [1, 4]
        for p in s["points"]:
            assert p["requests_ok"] == 8 and p["requests_failed"] == 0 and p["simulated"] is True
            assert p["output_tokens_mean"] == 16  # ignore_eos honoured: served as asked
            assert p["server_output_tokens"] == p["client_output_tokens"] == 8 * 16
            # ITL may read ~0: sglang-router's Nagle hold delivers a short stream in one burst (docs/bench.md)
            assert p["ttft_ms"]["p50"] > 0 and p["itl_ms"]["p99"] >= p["itl_ms"]["p50"] >= 0
            assert p["output_tokens_per_s_per_gpu"] == pytest.approx(p["output_tokens_per_s"] / 8, rel=1e-3)
            assert p["client"]["cpu_ms_per_request"] > 0
            assert json.loads((run / f"point-c{p['concurrency']}.json").read_text()) == p
            assert (run / f"c{p['concurrency']}" / "profile_export_aiperf.json").is_file()
        assert (
            60 <= s["points"][0]["input_tokens_mean"] <= 70
        )  # the vocabulary: prompts are words, one token each
        assert s["gpus"] == 8 and len(s["plan_digest"]) == 64 and s["versions"]
        assert (run / "topology.yaml").read_text() == (d.home.parent / f"{d.name}.yaml").read_text()
        assert sorted(s["charts"]) == ["cdf.png", "latency.png", "pareto.png", "throughput.png"]
        page = (run / "report.html").read_text()
        assert "SIMULATED" in page and page.count("data:image/png;base64,") == 4
        assert "Verdict: valid" in page and "href='c4/profile_export_aiperf.json'" in page
    finally:
        down(d)


@pytest.mark.parametrize(
    "mode, every, reason",
    [
        ("sse-error", 3, "SSE error event"),
        ("status-500", 3, "request(s) failed"),
        ("zero-tokens", 1, "no request succeeded"),
        ("short", 1, "far below the 16 asked"),
        ("miscount", 1, "the engines' counters"),
    ],
)
def test_the_gate_fails_a_misbehaving_server(deployment, tmp_path, mode, every, reason):
    """A real server answering badly: bench exits 1 naming why; aiperf alone calls the SSE error case a
    success."""
    d = deployment
    (port,) = free_ports(1)
    tok = tmp_path / "tok"
    from muse_launch.sim.config import parse_engine_args
    from muse_launch.sim.modeldir import make_model_dir

    tokenizer = make_model_dir(str(tok), parse_engine_args("vllm", ["bad-model"]))
    path = d.write(
        {
            "worker": {
                "kind": "worker",
                "port": port,
                "launcher": [sys.executable, BAD],
                "args": ["--mode", mode, "--every", str(every)],
                "ready": {"http": "/health"},
            }
        },
        engine="vllm",
        model="bad-model",
    )
    r = d.cli("up", path, "-d", "--no-engine-check", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        run = tmp_path / "run"
        r = d.cli(
            "bench",
            d.name,
            "--concurrency",
            "2",
            "--requests",
            "6",
            *POINT,
            "--tokenizer",
            tokenizer,
            "--out",
            run,
            timeout=300,
        )
        assert r.returncode == 1, r.stdout + r.stderr
        s = summary(run)
        assert s["valid"] is False and s["simulated"] is False
        assert any(reason in x for x in s["reasons"]), s["reasons"]
        assert "INVALID" in r.stdout and reason in r.stdout
    finally:
        down(d)


def test_equivalence_and_compare_of_pd_against_aggregated(deployment, tmp_path):
    d = deployment
    agg = Deployment(d.home, d.name[:30] + "-agg")
    up(d, d.write(pd_roles(*free_ports(4)), **TOP))
    try:
        up(agg, agg.write(agg_roles(*free_ports(2)), **TOP), *BESIDE)
        try:
            r = d.cli("bench", d.name, "--check-equivalence", agg.name, "--prompts", "3", timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "equivalent: 3 of 3 answers identical" in r.stdout
            runs = []
            for dep in (d, agg):
                runs.append(tmp_path / dep.name)
                r = dep.cli(
                    "bench",
                    dep.name,
                    "--concurrency",
                    "2",
                    "--requests",
                    "6",
                    *POINT,
                    "--out",
                    runs[-1],
                    timeout=300,
                )
                assert r.returncode == 0, r.stdout + r.stderr
            out = tmp_path / "cmp"
            r = d.cli("bench", "compare", *runs, "--out", out, timeout=120)
            assert r.returncode == 0, r.stdout + r.stderr
            assert d.name in r.stdout and agg.name in r.stdout and "(simulated)" in r.stdout
            assert (out / "pareto.png").stat().st_size > 1000
            cmp = json.loads((out / "compare.json").read_text())
            assert [row["run"].split(" ")[0] for row in cmp["rows"]] == [d.name, agg.name]
        finally:
            down(agg)
    finally:
        down(d)


def test_equivalence_fails_when_answers_differ(deployment, tmp_path):
    """Two deployments serving different model names answer differently: the check says which prompts."""
    d = deployment
    other = Deployment(d.home, d.name[:30] + "-other")
    up(d, d.write(agg_roles(*free_ports(2)), **TOP))
    try:
        up(
            other,
            other.write(agg_roles(*free_ports(2)), **{**TOP, "args": ["--served-model-name", "other"]}),
            *BESIDE,
        )
        try:
            r = d.cli("bench", d.name, "--check-equivalence", other.name, "--prompts", "2", timeout=120)
            assert r.returncode == 1, r.stdout + r.stderr
            assert "NOT equivalent: 2 of 2 answers differ" in r.stdout
        finally:
            down(other)
    finally:
        down(d)


def test_sweep_dry_run_then_every_combination_once(deployment, tmp_path):
    d = deployment
    path = d.write(agg_roles(*free_ports(2)), **TOP)
    out = tmp_path / "sweep"
    args = [
        "sweep",
        path,
        "--rehearse",
        "--vary",
        "rehearse.itl_ms=1,4",
        "--concurrency",
        "2",
        "--requests",
        "6",
        *POINT,
        "--out",
        out,
    ]
    r = d.cli(*args, "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 combination(s)" in r.stdout and r.stdout.count("[to run]") == 2 and not out.exists()
    r = d.cli(*args, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    itl = [summary(out / f"itl_ms={v}")["points"][0]["itl_ms"]["p50"] for v in (1, 4)]
    assert itl[1] > itl[0]  # the rehearse: block's rate reached the simulated engine
    assert (out / "compare" / "report.html").is_file()
    sweep = json.loads((out / "sweep.json").read_text())
    assert [x["state"] for x in sweep["results"]] == ["valid", "valid"]
    assert sweep["wall_s"] >= sweep["sum_of_parts_s"] > 0
    r = d.cli(*args, "--dry-run")
    assert r.stdout.count("[done]") == 2
    r = d.cli(*args, timeout=120)
    assert r.returncode == 0 and r.stdout.count("done before") == 2, r.stdout + r.stderr
    assert not d.alive()
