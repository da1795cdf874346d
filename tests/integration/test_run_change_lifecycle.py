"""What a change leaves behind, on a running rehearsal (the simulated engine behind the real routers): a
change long after the router started is wired by the timeout counted from its registration; a refused `up`
of an edited file leaves the file the deployment had; a rolling restart is one change, which a `scale`
cannot slip into; a change whose supervisor was killed, or stopped by `down`, is not shown in progress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
from harness import free_ports, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

MODEL = "Qwen/Qwen3-0.6B"
REHEARSE = {"ready_after": 0.5, "itl_ms": 25}
PROBE = {"http": "/health", "interval": 0.1, "timeout": 120}


def pd(d, ports: list[int], decode_replicas: int = 1, router_ready: dict | None = None, rehearse=REHEARSE):
    prefill, decode, router, boot, metrics = ports[:5]
    return d.write(
        {
            "prefill": {"kind": "prefill", "port": prefill, "bootstrap_port": boot, "ready": PROBE},
            "decode": {"kind": "decode", "port": decode, "replicas": decode_replicas, "ready": PROBE},
            "router": {
                "kind": "router",
                "port": router,
                "prefill": ["prefill"],
                "decode": ["decode"],
                "metrics_port": metrics,
                **({"ready": router_ready} if router_ready else {}),
            },
        },
        engine="sglang",
        model=MODEL,
        rehearse=rehearse,
    )


def ok(d, *args, timeout: float = 300) -> str:
    result = d.cli(*args, timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def background(d, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "muse_launch", *args],
        env=d.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_change_long_after_the_router_started_is_wired_by_the_timeout_from_its_registration(deployment):
    """The router's readiness timeout is 6 s here; the scale comes once it has run longer than that (main:
    `router: not wired after 6s` at once, the new decode withdrawn)."""
    d = deployment
    ready = {"http": "/readiness", "interval": 0.1, "timeout": 6}
    ok(d, "up", pd(d, free_ports(5), router_ready=ready), "--rehearse", "-d", timeout=240)
    router = next(r for r in d.state_file()["roles"] if r["name"] == "router")
    started = datetime.fromisoformat(router["started_at"])
    wait_for(lambda: (datetime.now(started.tzinfo) - started).total_seconds() > 8, timeout=30, interval=0.2)
    out = ok(d, "scale", d.name, "decode", "2")
    assert "decode: 1 -> 2 instances" in out, out
    assert d.role("router")["wiring"] == {"prefill": "1/1", "decode": "2/2"}
    assert d.status()["state"] == "ready"
    ok(d, "down", d.name)
    assert d.alive() == []


def test_a_refused_up_of_an_edited_file_is_not_adopted_for_later_changes(deployment):
    """vllm-router cannot be given a new role while it runs: the `up` that also sets decode's memory
    fraction is refused with nothing changed, and a later `scale` starts decode-1 with the flags of the file
    the deployment runs (main: with the refused file's 0.7, and a router restarted with its workers)."""
    d = deployment
    prefill, decode, long, router, metrics, side_p, side_d, side_l = free_ports(8)

    def vllm(edited: bool):
        roles = {
            "prefill": {"kind": "prefill", "port": prefill, "side_channel_port": side_p},
            "decode": {"kind": "decode", "port": decode, "side_channel_port": side_d},
            "router": {
                "kind": "router",
                "engine": "vllm-router",
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode", "long"] if edited else ["decode"],
            },
        }
        if edited:
            roles["decode"]["mem_fraction"] = 0.7
            roles["long"] = {"kind": "decode", "port": long, "side_channel_port": side_l}
        return d.write(roles, engine="vllm", model=MODEL, rehearse=REHEARSE)

    ok(d, "up", vllm(False), "--rehearse", "-d")
    refused = d.cli("up", vllm(True), "--rehearse", timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "nothing was changed" in refused.stderr, refused.stderr
    ok(d, "scale", d.name, "decode", "2", "--allow-downtime")
    argv = {r["name"]: r["argv"] for r in d.state_file()["roles"]}
    assert "0.7" not in argv["decode-1"], argv["decode-1"]
    assert not any("long" in str(a) for a in argv["router"])
    assert d.status()["state"] == "ready"
    ok(d, "down", d.name)
    assert d.alive() == []


def test_a_scale_during_a_rolling_restart_is_refused_naming_the_restart_which_completes(deployment):
    d = deployment
    slow = {**REHEARSE, "ready_after": 2}
    ok(d, "up", pd(d, free_ports(5), decode_replicas=2, rehearse=slow), "--rehearse", "-d")
    restarting = background(d, "restart", d.name, "decode")
    wait_for(lambda: (d.state_file().get("change") or {}).get("what"), timeout=60, interval=0.02)
    refusals = 0
    while restarting.poll() is None:  # at any moment of it, between its two instances too
        scaled = d.cli("scale", d.name, "prefill", "2", timeout=60)
        if restarting.poll() is not None and scaled.returncode == 0:
            break  # it came after the restart ended
        assert scaled.returncode == 1, scaled.stdout + scaled.stderr
        assert "change is in progress (restart decode, rolling over 2)" in scaled.stderr, scaled.stderr
        refusals += 1
    out = restarting.communicate(timeout=300)[0]
    assert restarting.returncode == 0, out
    assert refusals >= 1
    assert [d.role(n)["generation"] for n in ("decode-0", "decode-1")] == [1, 1]
    ok(d, "down", d.name)
    assert d.alive() == []


def _scale_in_progress(d) -> subprocess.Popen:
    scaler = background(d, "scale", d.name, "decode", "2")
    wait_for(lambda: (d.state_file().get("change") or {}).get("what"), timeout=60, interval=0.02)
    return scaler


def test_a_change_whose_supervisor_was_killed_is_not_shown_in_progress(deployment):
    d = deployment
    ok(d, "up", pd(d, free_ports(5), rehearse={**REHEARSE, "ready_after": 6}), "--rehearse", "-d")
    scaler = _scale_in_progress(d)
    os.kill(d.state_file()["supervisor_pid"], signal.SIGKILL)
    scaler.communicate(timeout=120)
    assert d.state_file()["change"] is not None  # the mark it left
    status = d.status()
    assert status["change"] is None and status["supervisor_pid"] is None
    shown = d.cli("status", d.name, timeout=60)
    assert "changing" not in shown.stdout, shown.stdout
    ok(d, "down", d.name)
    assert d.state_file()["change"] is None
    assert d.alive() == []


def test_down_in_the_middle_of_a_change_clears_it(deployment):
    d = deployment
    ok(d, "up", pd(d, free_ports(5), rehearse={**REHEARSE, "ready_after": 6}), "--rehearse", "-d")
    scaler = _scale_in_progress(d)
    began = time.monotonic()
    ok(d, "down", d.name)
    scaler.communicate(timeout=120)
    assert d.state_file()["change"] is None and d.status()["change"] is None
    assert time.monotonic() - began < 120
    assert d.alive() == []
