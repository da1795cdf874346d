"""The bench's pure parts: the gate's rules, aiperf's export read back (an SSE error event aiperf counts as
ok), the aiperf command line and environment, --vary combinations, and a missing aiperf named with its pip
line."""

import json
from pathlib import Path

import pytest
from cli_run import REPO

from muse_launch.bench import aiperf as ap
from muse_launch.bench.gate import PointFigures, judge_point
from muse_launch.bench.sweep import combinations, parse_vary, slug
from muse_launch.errors import MissingDependency, UsageError


def fig(**kw):
    base = dict(
        concurrency=4,
        requests_ok=10,
        requests_failed=0,
        output_tokens=1280.0,
        output_tokens_mean=128.0,
        server_tokens=1280.0,
    )
    return PointFigures(**{**base, **kw})


def test_gate_rules():
    assert judge_point(fig(), 128) == []
    assert "2 request(s) failed (first: x)" in judge_point(fig(requests_failed=2, errors=("x",)), 128)[0]
    assert judge_point(fig(requests_ok=0, output_tokens=0), 128) == ["concurrency 4: no request succeeded"]
    assert "0 output tokens" in judge_point(fig(output_tokens=0.0, output_tokens_mean=0.0), 128)[0]
    assert "far below the 128 asked" in judge_point(fig(output_tokens_mean=69.0), 128)[0]
    assert judge_point(fig(output_tokens_mean=116.0), 128) == []  # within 90%
    assert "engines' counters 2560" in judge_point(fig(server_tokens=2560.0), 128)[0]
    assert judge_point(fig(server_tokens=1290.0), 128) == []  # within the tolerance
    assert judge_point(fig(server_tokens=None), 128) == []  # no counter to check against
    assert "did not finish" in judge_point(fig(timed_out=True), 128)[0]
    assert judge_point(fig(generator_failed="exit 2"), 128) == [
        "concurrency 4: the load generator failed: exit 2"
    ]


def export(tmp: Path, **over) -> Path:
    d = {
        "schema_version": "1.4",
        "request_count": {"avg": 5},
        "completed_request_count": {"avg": 6},
        "time_to_first_token": {"p50": 10.0, "p99": 20.0},
        "inter_token_latency": {"p50": 2.0, "p99": 3.0},
        "request_throughput": {"avg": 4.0},
        "output_token_throughput": {"avg": 100.0},
        "output_token_throughput_per_user": {"p50": 50.0},
        "total_output_tokens": {"avg": 80.0},
        "output_sequence_length": {"avg": 16.0},
        "input_sequence_length": {"avg": 64.0},
        "benchmark_duration": {"avg": 1.5},
        "error_summary": [{"error_details": {"code": 500, "message": "boom"}, "count": 1}],
        **over,
    }
    (tmp / ap.EXPORT).write_text(json.dumps(d))
    return tmp


def raw_line(status: int, *values: str) -> str:
    return json.dumps(
        {"status": status, "responses": [{"packets": [{"name": "data", "value": v} for v in values]}]}
    )


def test_read_point_counts_sse_error_events(tmp_path):
    export(tmp_path)
    ok = json.dumps({"choices": [{"delta": {"content": "a"}}]})
    (tmp_path / ap.RAW).write_text(
        "\n".join(
            [
                raw_line(200, ok, ok),
                raw_line(200, ok, json.dumps({"error": {"message": "mid-stream"}}), "[DONE]"),
                raw_line(500, json.dumps({"error": "counted by aiperf"})),
                "not json",
            ]
        )
    )
    m = ap.read_point(tmp_path)
    assert (m.requests_ok, m.requests_failed) == (4, 2)  # aiperf's 1 failure + 1 stream error
    assert m.ttft_ms == {"p50": 10.0, "p90": None, "p99": 20.0, "max": None, "avg": None}
    assert m.itl_ms["p50"] == 2.0 and m.itl_ms["p99"] == 3.0 and m.e2e_ms["p50"] is None
    assert m.errors[0] == "1 x 500: boom" and "mid-stream" in m.errors[1]


def test_output_tokens_count_reasoning(tmp_path):
    """A reasoning model that spends the budget thinking: aiperf's total_output_tokens is absent, total_osl is
    not."""
    export(
        tmp_path, total_output_tokens=None, total_osl={"avg": 256.0}, total_reasoning_tokens={"avg": 256.0}
    )
    assert ap.read_point(tmp_path).output_tokens == 256.0
    export(tmp_path, total_output_tokens={"avg": 10.0}, total_reasoning_tokens={"avg": 6.0})
    assert ap.read_point(tmp_path).output_tokens == 16.0


def test_read_point_refuses_another_schema(tmp_path):
    with pytest.raises(ValueError, match="no aiperf export"):
        ap.read_point(tmp_path)
    export(tmp_path, schema_version="2.0")
    with pytest.raises(ValueError, match="expected 1.4"):
        ap.read_point(tmp_path)


def test_point_argv_is_bounded_and_offline(tmp_path):
    argv = ap.point_argv(
        "aiperf", "http://127.0.0.1:8000", "m", "/models/tok", ap.PointPlan(16, 512, 128, 200, 60.0), tmp_path
    )
    for flag, value in (
        ("--concurrency", "16"),
        ("--request-count", "200"),
        ("--benchmark-duration", "60"),
        ("--tokenizer", "/models/tok"),
        ("--extra-inputs", "ignore_eos:true"),
        ("--isl", "512"),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert {"--use-server-token-count", "--no-gpu-telemetry", "--streaming"} <= set(argv)
    env = ap.child_env({"HF_HUB_OFFLINE": "1", "PATH": "/bin"})
    assert "HF_HUB_OFFLINE" not in env and env["PATH"] == "/bin"


def test_missing_aiperf_names_the_pip_line(monkeypatch, tmp_path):
    monkeypatch.setattr(ap.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr(ap.shutil, "which", lambda name: None)
    with pytest.raises(MissingDependency) as exc:
        ap.find_aiperf()
    assert "aiperf==0.13.0" in exc.value.fix and "muse-launch[bench]" not in exc.value.fix  # not on PyPI
    # The line the README and docs/bench.md give, so a user meets one install command, not two.
    line = exc.value.fix.split("#")[0].strip()
    assert line == "pip install -e '.[bench]'"
    assert f"`.venv/bin/{line}`" in (REPO / "README.md").read_text()
    assert f"\n{line} " in (REPO / "docs" / "bench.md").read_text()


def test_vary_combinations():
    axes = parse_vary(("roles.decode.replicas=1,2", "rehearse.itl_ms=1,4,8"))
    combos = combinations(axes)
    assert len(combos) == 6 and combos[0] == ("roles.decode.replicas=1", "rehearse.itl_ms=1")
    assert slug(combos[-1]) == "replicas=2_itl_ms=8"
    for bad in (("nothing",), ("k=",), ("=1,2",), ("a=1", "a=2"), ()):
        with pytest.raises(UsageError):
            parse_vary(bad)


import os  # noqa: E402

from muse_launch.bench.run_record import read_summary, refuse_existing  # noqa: E402
from muse_launch.bench.sweep import SweepOptions, done_before, set_aside, sweep_key  # noqa: E402


def point(c: int = 1, **over) -> dict:
    return {
        "concurrency": c,
        "valid": True,
        "reasons": [],
        "requests_ok": 16,
        "requests_failed": 0,
        "ttft_ms": {"p50": 10.0 * c, "p99": 20.0 * c},
        "itl_ms": {"p50": 2.0, "p99": 3.0},
        "requests_per_s": 4.0 * c,
        "output_tokens_per_s": 100.0 * c,
        "output_tokens_per_s_per_gpu": 50.0 * c,
        "output_tokens_per_s_per_user": 100.0 / c,
        **over,
    }


def record(tmp: Path, name: str, deployment="pd", points=None, **over) -> Path:
    run = tmp / name
    run.mkdir(parents=True)
    summary = {
        "format": 1,
        "valid": True,
        "reasons": [],
        "deployment": deployment,
        "gpus": 2,
        "points": points if points is not None else [point(1), point(4)],
        **over,
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_read_summary_refuses_deep_json_a_device_and_a_fifo_without_hanging(tmp_path):
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deep|not a bench record"):
        read_summary(deep)
    zero = tmp_path / "zero"
    zero.mkdir()
    (zero / "summary.json").symlink_to("/dev/zero")
    with pytest.raises(ValueError, match="not a regular file"):
        read_summary(zero)
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "summary.json")
    with pytest.raises(ValueError, match="not a regular file"):
        read_summary(fifo)  # a blocking open would wait for a writer forever


def test_bench_refuses_an_out_that_holds_a_record(tmp_path):
    refuse_existing(tmp_path / "new")  # nothing there: fine
    (tmp_path / "empty").mkdir()
    refuse_existing(tmp_path / "empty")
    (tmp_path / "empty" / "sweep.log").write_text("a sweep's log is not a record")
    refuse_existing(tmp_path / "empty")
    old = record(tmp_path, "old")
    with pytest.raises(UsageError, match="already holds a bench record"):
        refuse_existing(old)
    (tmp_path / "pts").mkdir()
    (tmp_path / "pts" / "c4").mkdir()
    with pytest.raises(UsageError, match="already holds a bench record"):
        refuse_existing(tmp_path / "pts")
    with pytest.raises(UsageError, match="is a file"):
        refuse_existing(old / "summary.json")


def test_a_resumed_sweep_runs_an_invalid_combination_again(tmp_path):
    from muse_launch.bench.measure import BenchPlan

    opts = SweepOptions(
        tmp_path / "t.yaml",
        ("roles.decode.replicas=1,2",),
        (),
        True,
        False,
        BenchPlan((1,), 8, 8, 16, 5.0),
        tmp_path,
    )
    combo = ("roles.decode.replicas=1",)
    valid = record(tmp_path, "valid", sweep=sweep_key(combo, opts))
    invalid = record(tmp_path, "invalid", valid=False, reasons=["x"], sweep=sweep_key(combo, opts))
    assert done_before(valid, combo, opts)
    assert not done_before(invalid, combo, opts)
    aside = set_aside(invalid)
    assert aside is not None and (aside / "summary.json").is_file() and not invalid.exists()
    assert set_aside(invalid) is None


from muse_launch.bench.measure import goodput, parse_slo  # noqa: E402
from muse_launch.bench.report import table_lines, write_report  # noqa: E402
from muse_launch.bench.run_record import verdict_of  # noqa: E402


def test_slo_parses_units_and_refuses_nonsense():
    slo = parse_slo("ttft=0.5s,itl=50ms,e2e=10s,attain=95%")
    assert dict(slo.targets_ms) == {"ttft": 500.0, "itl": 50.0, "e2e": 10000.0} and slo.attain_pct == 95.0
    for bad in ("ttft", "ttft=fast", "tpot=5ms", "ttft=-1ms", "attain=150", "ttft=1ms,ttft=2ms", "attain=90"):
        with pytest.raises(UsageError):
            parse_slo(bad)


def test_goodput_counts_requests_meeting_every_target():
    slo = parse_slo("ttft=500ms,itl=50ms,attain=50")
    reqs = [
        {"ttft": 100.0, "itl": 10.0, "tokens": 100.0},  # good
        {"ttft": 600.0, "itl": 10.0, "tokens": 100.0},  # TTFT over
        {"ttft": 100.0, "itl": 60.0, "tokens": 100.0},  # ITL over
        {"ttft": 500.0, "itl": 50.0, "tokens": 50.0},  # on the targets: good
    ]
    g = goodput(slo, reqs, 2.0, 350.0, 2)  # the point's raw 2 req/s, 350 tok/s
    assert g["requests_good"] == 2 and g["attained_pct"] == 50.0 and g["meets_slo"]
    assert g["requests_per_s"] == 1.0 and g["output_tokens_per_s"] == 150.0  # 150 of the 350 tokens were good
    assert g["output_tokens_per_s_per_gpu"] == 75.0
    assert not goodput(parse_slo("ttft=500ms"), [], 1.0, 1.0, None)["meets_slo"]


def test_verdict_says_a_starved_client_and_why():
    assert verdict_of([], []) == "valid"
    assert verdict_of([], ["warning: the client machine's CPUs were 100% busy"]) == "valid, client-limited"
    assert verdict_of(["concurrency 4: no request succeeded"], ["x"]) == "invalid"


def test_report_has_percentiles_goodput_metadata_links_and_charts(tmp_path):
    slo = parse_slo("ttft=500ms,itl=50ms")
    d = tmp_path / "c4"
    d.mkdir()
    lines = []
    for i in range(20):
        metrics = {
            "time_to_first_token": {"value": 100.0 + 50 * i, "unit": "ms"},
            "inter_token_latency": {"value": 20_000_000.0, "unit": "ns"},
            "request_latency": {"value": 3.0, "unit": "sec"},
            "output_sequence_length": {"value": 128, "unit": "tokens"},
        }
        lines.append(json.dumps({"metadata": {}, "metrics": metrics, "error": None}))
    lines.append(json.dumps({"metadata": {}, "metrics": {}, "error": {"code": 500}}))
    (d / "profile_export.jsonl").write_text("\n".join(lines) + "\n")
    (d / "profile_export_aiperf.json").write_text("{}")
    reqs = ap.request_figures(d)
    assert len(reqs) == 20 and reqs[0] == {"ttft": 100.0, "itl": 20.0, "e2e": 3000.0, "tokens": 128.0}
    pct = {"p50": 575.0, "p90": 1050.0, "p99": 1040.0, "max": 1050.0, "avg": 575.0}
    p = point(4, ttft_ms=pct, e2e_ms={"p50": 3000.0, "p90": 3000.0, "p99": 3000.0, "max": 3000.0})
    p["goodput"] = goodput(slo, reqs, 10.0, 1000.0, 2)
    summary = {
        "valid": True,
        "verdict": "valid, client-limited",
        "reasons": [],
        "caveats": ["warning: the client machine's CPUs were 100% busy"],
        "warnings": ["warning: the client machine's CPUs were 100% busy"],
        "deployment": "pd <b>$\\frac{1}{2}$",
        "url": "http://127.0.0.1:1",
        "model": "m",
        "plan": {"isl": 512, "osl": 128, "concurrency": [4], "seed": 0},
        "gpus": 2,
        "plan_digest": "d1g",
        "versions": {"sglang": "0.5.23 (simulated)"},
        "slo": slo.as_dict(),
        "command": "muse-launch bench pd --slo ttft=500ms,itl=50ms",
        "started": "2026-12-03T07:00:00Z",
        "finished": "2026-12-03T07:01:00Z",
        "roles": [{"name": "prefill", "kind": "prefill", "engine": "sglang", "gpus": [0, 1], "url": "u"}],
        "points": [p],
    }
    charts = write_report(summary, tmp_path)
    assert charts == ["cdf.png", "latency.png", "pareto.png", "throughput.png"]
    page = (tmp_path / "report.html").read_text()
    assert "Verdict: valid, client-limited" in page and "100% busy" in page
    assert "575.0/1050.0/1040.0/1050.0" in page and "45% NO" in page  # 9 of 20 under 500 ms
    assert "sglang 0.5.23 (simulated)" in page and "{'sglang'" not in page and "{'name'" not in page
    assert "prefill (prefill, sglang, GPUs 0,1)" in page
    assert "muse-launch bench pd --slo" in page and "2026-12-03T07:00:00Z" in page and "d1g" in page
    assert "href='c4/profile_export_aiperf.json'" in page and "<b>$" not in page
    assert page.count("<img ") == 4
    text = "\n".join(table_lines(summary))
    assert "TTFT p50/p90/p99/max" in text and "good tok/s/GPU" in text and "SLO ttft<=500ms" in text


def test_sweep_pick_writes_the_variant_with_the_most_goodput_per_gpu(tmp_path):
    from muse_launch.bench.measure import BenchPlan
    from muse_launch.bench.sweep import pick_variant
    from muse_launch.core import load_plan

    topology = Path(__file__).parents[2] / "topologies" / "pd-b300-low-latency.yaml"
    slo = parse_slo("ttft=500ms,itl=50ms")
    pick = tmp_path / "best.yaml"
    opts = SweepOptions(
        topology, ("rehearse.itl_ms=2,8",), (), True, False, BenchPlan((1, 4), 64, 16, 8, 5.0, slo=slo),
        tmp_path, pick=pick,
    )  # fmt: skip
    g = {"meets_slo": True, "attained_pct": 100.0}
    results = []
    for itl, per_gpu, meets in (("2", 30.0, True), ("8", 90.0, False), ("5", 60.0, True)):
        combo = (f"rehearse.itl_ms={itl}",)
        pts = [
            point(1, goodput={**g, "output_tokens_per_s_per_gpu": per_gpu / 2}),
            point(4, goodput={**g, "output_tokens_per_s_per_gpu": per_gpu, "meets_slo": meets}),
        ]
        run = record(tmp_path, f"itl{itl}", points=pts)
        results.append({"combination": list(combo), "run": str(run), "state": "valid"})
    lines: list[str] = []
    assert pick_variant(opts, results, lines.append) == 0
    text = pick.read_text()
    assert text.startswith("# picked by `muse-launch sweep --pick`: rehearse.itl_ms=5")
    assert "#   rehearse.itl_ms=8: 45.0 at concurrency 1" in text  # its c=4 misses the SLO
    picked = load_plan(pick, [], rehearse=True).plan
    assert picked == load_plan(topology, ["rehearse.itl_ms=5"], rehearse=True).plan
    none = [{**r, "run": str(record(tmp_path / "n", Path(r["run"]).name, valid=False))} for r in results]
    pick.unlink()
    assert pick_variant(opts, none, lines.append) == 1 and not pick.exists()
    assert "no variant meets the SLO" in lines[-1]
