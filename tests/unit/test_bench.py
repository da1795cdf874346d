"""The bench's pure parts: the gate's rules, aiperf's export read back (an SSE error event aiperf counts as
ok), the aiperf command line and environment, --vary combinations, and a missing aiperf named with its pip
line."""

import json
from pathlib import Path

import pytest

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
    assert m.ttft_ms == {"p50": 10.0, "p99": 20.0} and m.itl_ms == {"p50": 2.0, "p99": 3.0}
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
    assert "aiperf==0.13.0" in exc.value.fix and "muse-launch[bench]" in exc.value.fix


def test_vary_combinations():
    axes = parse_vary(("roles.decode.replicas=1,2", "rehearse.itl_ms=1,4,8"))
    combos = combinations(axes)
    assert len(combos) == 6 and combos[0] == ("roles.decode.replicas=1", "rehearse.itl_ms=1")
    assert slug(combos[-1]) == "replicas=2_itl_ms=8"
    for bad in (("nothing",), ("k=",), ("=1,2",), ("a=1", "a=2"), ()):
        with pytest.raises(UsageError):
            parse_vary(bad)


# --- records and readers that hold against a fault probe (issue 34) ---------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from muse_launch.bench.record import read_summary, refuse_existing  # noqa: E402
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


def cli(*args, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ({"points": [point(1, requests_per_s="fast")]}, "requests_per_s is not a number"),
        ({"points": [point(1, ttft_ms={"p50": "10"})]}, "ttft_ms is not a set of figures"),
        ({"points": [{"concurrency": 1, "requests_ok": 1, "requests_failed": 0}]}, "is not a set of figures"),
        ({"points": [point(1, requests_ok=True)]}, "requests_ok is not a count"),
        ({"deployment": 12}, "deployment name is not a string"),
        ({"gpus": "two"}, "GPU count is not a number"),
        ({"points": [point(c) for c in range(1, 5001)]}, "more than a bench run writes"),
    ],
)
def test_compare_refuses_a_damaged_record_with_exit_2(tmp_path, damage, says):
    good = record(tmp_path, "good")
    bad = record(tmp_path, "bad", **damage)
    started = time.monotonic()
    r = cli("bench", "compare", good, bad, "--out", tmp_path / "cmp", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - started < 30


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


def test_compare_draws_a_mathtext_name_and_prints_no_escape_sequence(tmp_path):
    a = record(tmp_path, "a", deployment="$\\frac{1}{0}$ cost")
    b = record(tmp_path, "b", deployment="evil\x1b]0;owned\x07\x1b[2J")
    r = cli("bench", "compare", a, b, "--out", tmp_path / "cmp", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout
    assert "evil?]0;owned??[2J" in r.stdout
    assert (tmp_path / "cmp" / "pareto.png").stat().st_size > 1000


def test_compare_out_that_is_a_file_is_a_usage_error(tmp_path):
    a, b = record(tmp_path, "a"), record(tmp_path, "b")
    (tmp_path / "f").write_text("x")
    r = cli("bench", "compare", a, b, "--out", tmp_path / "f", cwd=tmp_path)
    assert r.returncode == 2 and "cannot be a directory" in r.stderr and "Traceback" not in r.stderr


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
