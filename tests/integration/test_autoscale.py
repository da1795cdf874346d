"""The autoscaler on a running rehearsal (simulated engines behind the real sglang-router): a step of load
three times what one decode takes at once, then nothing. Only what cannot be noise is asserted: no request
fails, the GPU budget is never exceeded, at least one scale-up comes under the step, and the deployment is
back at its minimum once the load has stopped."""

from __future__ import annotations

import json
import threading

import pytest
from harness import free_ports, wait_for
from steady_load import SteadyLoad

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

MODEL = "Qwen/Qwen3-0.6B"
BUDGET = 4  # GPUs, one per instance: prefill and decode together


def topology(d, ports):
    prefill, decode, router, boot, metrics = ports
    probe = {"http": "/health", "interval": 0.1, "timeout": 120}
    return d.write(
        {
            "prefill": {
                "kind": "prefill",
                "gpus": [0],
                "port": prefill,
                "bootstrap_port": boot,
                "ready": probe,
            },
            "decode": {"kind": "decode", "gpus": [1], "port": decode, "ready": probe},
            "router": {
                "kind": "router",
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode"],
            },
        },
        engine="sglang",
        model=MODEL,
        hardware="b300",
        # a decode runs 2 requests at once, 20 ms a token, and takes 1 s to start
        rehearse={"ready_after": 1.0, "itl_ms": 20, "max_running": 2},
        autoscale={
            "targets": {"ttft": 0.5, "itl": 0.05},
            "gpus": BUDGET,
            "interval": 2,
            "roles": {"prefill": {"min": 1, "max": 3}, "decode": {"min": 1, "max": 3}},
        },
    )


def decisions(d) -> list[dict]:
    path = d.run_dir / "decisions.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def instances(d) -> dict[str, int]:
    out: dict[str, int] = {}
    for role in d.status()["roles"]:
        if role["kind"] in ("prefill", "decode") and role["state"] not in ("stopped", "failed"):
            out[role["kind"]] = out.get(role["kind"], 0) + 1
    return out


def test_a_step_scales_up_without_a_failed_request_within_budget_and_back_to_the_minimum(deployment):
    d = deployment
    ports = free_ports(5)
    result = d.cli("up", topology(d, ports), "--rehearse", "-d", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    seen: list[dict[str, int]] = []
    watching = threading.Event()

    def watch() -> None:  # the instances as `status` shows them, all along
        while not watching.wait(0.3):
            seen.append(instances(d))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with SteadyLoad(f"http://127.0.0.1:{ports[2]}", MODEL, concurrency=6, max_tokens=40) as load:
            wait_for(
                lambda: any(x["kind"] == "up" and x["outcome"] == "done" for x in decisions(d)), timeout=90
            )
            load.wait_for(12)
        wait_for(lambda: instances(d) == {"prefill": 1, "decode": 1} and not d.status()["change"], timeout=90)
    finally:
        watching.set()
        watcher.join(10)
    assert load.failures == [] and load.ok >= 12, load.failures
    assert seen and all(sum(s.values()) <= BUDGET for s in seen), seen
    made = decisions(d)
    assert all(x["to"] <= 3 for x in made) and any(x["kind"] == "idle" for x in made), made
    status = d.cli("status", d.name)
    assert "autoscale: " in status.stdout, status.stdout
    result = d.cli("down", d.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert d.alive() == []
