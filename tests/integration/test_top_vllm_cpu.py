"""`top --once --json` against the real vLLM on the CPU behind the real sglang-router: the metric names top
reads are the ones vLLM exports, and the router's per-worker load is read from its own Prometheus port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_vllm_cpu import AGG_FILE, REPO, SERVED_MODEL, UP_TIMEOUT, require, vllm_setup  # noqa: F401  (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.vllm_cpu, pytest.mark.timeout(900)]


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_top_reads_vllms_own_metrics_and_the_routers_worker_load(vllm_setup, tmp_path: Path):  # noqa: F811
    setup = require(vllm_setup)
    env = {
        **os.environ,
        "MUSE_LAUNCH_HOME": str(tmp_path / "home"),
        "MUSE_LAUNCH_TINY_MODEL": str(setup.model),
        "MUSE_LAUNCH_VLLM_PYTHON": str(setup.python),
        "HF_HUB_OFFLINE": "1",
    }
    up = _cli(env, "up", str(AGG_FILE), "-d", timeout=UP_TIMEOUT)
    stop = threading.Event()
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        status = json.loads(_cli(env, "status", "agg-vllm-cpu", "--json").stdout)
        router_url = next(r["url"] for r in status["roles"] if r["kind"] == "router")

        errors: list[str] = []

        def load() -> None:
            body = {
                "model": SERVED_MODEL,
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 16,
            }
            with httpx.Client(timeout=120) as client:
                for _ in range(400):
                    if stop.is_set():
                        return
                    try:
                        client.post(f"{router_url}/v1/chat/completions", json=body).raise_for_status()
                    except httpx.HTTPError as exc:
                        errors.append(repr(exc))

        threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 240  # a loaded 2-core machine: poll until a window saw tokens
        while True:
            top = _cli(env, "top", "agg-vllm-cpu", "--once", "--json", "--interval", "2")
            assert top.returncode == 0, top.stderr
            worker = json.loads(top.stdout)["roles"][0]
            if (worker["generation_tokens_per_s"] or 0) > 0 or time.monotonic() > deadline:
                break
        stop.set()
        for t in threads:
            t.join(180)
        assert not errors, errors[:3]
        assert top.returncode == 0, top.stderr
        snap = json.loads(top.stdout)
        worker, router = snap["roles"]
        assert worker["metrics_unavailable"] is None, worker
        assert worker["generation_tokens_total"] > 0 and worker["prompt_tokens_total"] > 0, worker
        assert worker["generation_tokens_per_s"] > 0, worker
        assert worker["running"] is not None and worker["queued"] is not None, worker
        assert 0 <= worker["kv_cache_usage"] <= 1, worker
        assert router["metrics_url"].endswith(":18411/metrics") and router["metrics_unavailable"] is None, (
            router
        )
        workers = snap["routers"][0]["workers"]
        assert [w["role"] for w in workers] == ["worker"] and workers[0]["healthy"] is True, workers
    finally:
        stop.set()
        down = _cli(env, "down", "agg-vllm-cpu", timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
