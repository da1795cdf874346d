"""`bench` against a real engine: vLLM on the CPU, P/D (examples/pd-vllm-cpu.yaml, ExampleConnector behind
vllm-router) and aggregated (examples/agg-vllm-cpu.yaml, behind sglang-router), both up at once; a small
bounded bench of each, `bench compare` of the two, and `--check-equivalence` between them passing.

Needs the vLLM-on-CPU venv (scripts/install_vllm_cpu.sh; scripts/test.sh runs it) and aiperf (the bench
extra). Without them these tests fail: CI never passes by skipping its one real engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu, pytest.mark.bench, pytest.mark.timeout(2400)]

PD, AGG = "pd-vllm-cpu", "agg-vllm-cpu"
POINT = ["--concurrency", "1,2", "--isl", "64", "--osl", "16", "--requests", "4", "--duration", "300"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """scripts/vllm_cpu_setup.sh's two variables (the venv and the tiny model), and a fresh home."""
    setup = subprocess.run(
        ["bash", str(REPO / "scripts" / "vllm_cpu_setup.sh")], capture_output=True, text=True, timeout=1800
    )
    assert setup.returncode == 0, f"scripts/vllm_cpu_setup.sh failed:\n{setup.stderr[-2000:]}"
    found = dict(
        line.removeprefix("export ").split("=", 1)
        for line in setup.stdout.splitlines()
        if line.startswith("export ")
    )
    assert {"MUSE_LAUNCH_VLLM_PYTHON", "MUSE_LAUNCH_TINY_MODEL"} <= set(found), setup.stdout
    home = tmp_path_factory.mktemp("bench-vllm") / "home"
    home.mkdir()
    return {**os.environ, **{k: v.strip("'\"") for k, v in found.items()}, "MUSE_LAUNCH_HOME": str(home)}


def cli(env: dict, *args, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *map(str, args)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_bench_compare_and_equivalence_of_pd_and_aggregated_vllm(env, tmp_path):
    up = {}
    try:
        for name in (PD, AGG):
            up[name] = cli(env, "up", REPO / "examples" / f"{name}.yaml", "-d", timeout=900)
            assert up[name].returncode == 0, up[name].stdout + up[name].stderr
        runs = {}
        for name in (PD, AGG):
            runs[name] = tmp_path / name
            r = cli(env, "bench", name, *POINT, "--out", runs[name])
            assert r.returncode == 0, r.stdout + r.stderr
            s = json.loads((runs[name] / "summary.json").read_text())
            assert s["valid"] and not s["simulated"] and "SIMULATED" not in r.stdout
            for p in s["points"]:
                assert p["requests_ok"] == 4 and p["requests_failed"] == 0
                assert p["output_tokens_mean"] == 16
                assert (
                    p["server_output_tokens"] == p["client_output_tokens"] == 64
                )  # vLLM's own counter agrees
            assert s["versions"].get("vllm")
        r = cli(env, "bench", "compare", runs[PD], runs[AGG], "--out", tmp_path / "cmp")
        assert r.returncode == 0, r.stdout + r.stderr
        assert PD in r.stdout and AGG in r.stdout and (tmp_path / "cmp" / "pareto.png").is_file()
        r = cli(env, "bench", PD, "--check-equivalence", AGG, "--prompts", "4")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "equivalent: 4 of 4 answers identical" in r.stdout
    finally:
        for name in up:
            down = cli(env, "down", name, timeout=300)
            assert down.returncode == 0, down.stdout + down.stderr
