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
