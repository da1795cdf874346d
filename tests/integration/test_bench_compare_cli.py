"""The bench's pure parts: the gate's rules, aiperf's export read back (an SSE error event aiperf counts as
ok), the aiperf command line and environment, --vary combinations, and a missing aiperf named with its pip
line."""

import json
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts processes


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
        ({"points": [point(1, goodput="lots")]}, "goodput is not a set of figures"),
        ({"points": [point(1, goodput={"requests_per_s": "9"})]}, "goodput is not a set of figures"),
        ({"points": [point(1, e2e_ms=[1])]}, "e2e_ms is not a set of figures"),
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


def test_compare_by_run_id_with_delta_and_ratio_goodput_first(tmp_path):
    home = tmp_path / "home"
    g = {"output_tokens_per_s_per_gpu": 40.0, "requests_per_s": 2.0, "attained_pct": 95.0, "meets_slo": True}
    a = record(home / "pd" / "bench", "20261203-070000", points=[point(4, goodput=g)])
    b_points = [point(4, goodput={**g, "output_tokens_per_s_per_gpu": 60.0}, output_tokens_per_s=300.0)]
    record(home / "agg" / "bench", "20261203-080000", deployment="agg", points=b_points)
    record(home / "other" / "bench", "20261203-070000", deployment="other")
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(home)}
    run = subprocess.run(
        [sys.executable, "-m", "muse_launch", "bench", "compare", "pd/20261203-070000", "20261203-080000"]
        + ["--out", str(tmp_path / "cmp")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    diff = lines[next(i for i, x in enumerate(lines) if x.startswith("against pd")) + 2 :]
    assert diff[0].split()[1:3] == ["good", "tok/s/GPU"] and diff[0].split()[-2:] == ["+20", "1.50x"]
    assert any(x.split()[1:3] == ["out", "tok/s"] and x.split()[-1] == "0.75x" for x in diff)
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert cmp["differences"][0]["metric"] == "good tok/s/GPU" and cmp["differences"][0]["ratio"] == 1.5
    ambiguous = subprocess.run(
        [sys.executable, "-m", "muse_launch", "bench", "compare", "20261203-070000", str(a)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ambiguous.returncode == 2 and "names 2 runs" in ambiguous.stderr
