"""An EPD topology of stand-ins, planned by the real planner, behind the real sglang-router."""

from __future__ import annotations

import signal
import sys
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from harness import ROUTER, STAND_IN, free_ports, port_open, wait_for

pytestmark = pytest.mark.integration


def epd_topology(d, ports: list[int]) -> Path:
    encoder, prefill, decode, router, metrics, boot, enc_boot_p, enc_boot_d = ports
    probe = {"http": "/health", "interval": 0.05, "timeout": 30}
    return d.write(
        {
            "encoder": {"kind": "encoder", "port": encoder, "args": ["--ready-after", "1.0"], "ready": probe},
            "prefill": {
                "kind": "prefill",
                "port": prefill,
                "encoders": ["encoder"],
                "bootstrap_port": boot,
                "encoder_bootstrap_port": enc_boot_p,
                "args": ["--ready-after", "1.5"],
                "ready": probe,
            },
            "decode": {
                "kind": "decode",
                "port": decode,
                "encoders": ["encoder"],
                "encoder_bootstrap_port": enc_boot_d,
                "args": ["--ready-after", "1.0"],
                "ready": probe,
            },
            "router": {
                "kind": "router",
                "launcher": [ROUTER, "launch"],
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode"],
                "ready": {"http": "/readiness", "interval": 0.05, "timeout": 30},
            },
        },
        model=str(Path(STAND_IN).parent),  # a local directory: the router never tries to download a tokenizer
        launcher=[sys.executable, STAND_IN],  # the stand-in takes `sglang serve`'s place
    )


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_epd_starts_in_waves_behind_the_real_router_and_stops_clean(deployment):
    ports = free_ports(8)
    topology = epd_topology(deployment, ports)

    up = deployment.cli("up", topology, "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "ready in" in up.stdout

    status = deployment.status()
    assert status["state"] == "ready"
    assert status["supervisor_pid"]
    assert [r["name"] for r in status["roles"]] == ["encoder", "decode", "prefill", "router"]  # wave by wave
    for role in status["roles"]:
        assert role["state"] == "ready" and role["health"] == "ok" and role["pgid"] == role["pid"]
    prefill_ports = {"http": ports[1], "encoder_bootstrap": ports[6], "bootstrap": ports[5]}
    assert deployment.role("prefill")["ports"] == prefill_ports

    roles = {r["name"]: r for r in deployment.state_file()["roles"]}
    # prefill and decode start together (in one wave: each before the other is ready, not after a fixed window
    # that a loaded machine can stretch), once the encoder is ready; the router once both are.
    assert seconds(roles["prefill"]["started_at"]) < seconds(roles["decode"]["ready_at"])
    assert seconds(roles["decode"]["started_at"]) < seconds(roles["prefill"]["ready_at"])
    assert seconds(roles["prefill"]["started_at"]) >= seconds(roles["encoder"]["ready_at"])
    assert seconds(roles["router"]["started_at"]) >= max(
        seconds(roles["prefill"]["ready_at"]), seconds(roles["decode"]["ready_at"])
    )

    answer = httpx.post(f"http://127.0.0.1:{ports[3]}/generate", json={"text": "hi"}, timeout=10)
    assert answer.status_code == 200

    logs = deployment.cli("logs", deployment.name, "router", "-n", "5")
    assert logs.returncode == 0 and logs.stdout.startswith("router |")
    # A deployment name that does not exist is named as such, not read as a role of the one running.
    wrong = deployment.cli("logs", "nosuch", "router", "-n", "5")
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines() == [
        f"error: no deployment or role named 'nosuch'; running: {deployment.name} "
        "(roles: encoder, decode, prefill, router)",
        f"  fix: `muse-launch logs {deployment.name} router`",
    ]
    fixed = deployment.cli(*wrong.stderr.split("`")[1].split()[1:], "-n", "5")  # the fix as typed
    assert fixed.returncode == 0 and fixed.stdout.startswith("router |")

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped router, decode, prefill, encoder in" in down.stdout  # reverse dependency order
    assert "SIGKILL" not in down.stdout
    assert deployment.alive() == []
    assert not any(port_open(p) for p in ports)
    status = deployment.status()
    assert status["state"] == "stopped" and status["supervisor_pid"] is None
    assert all(r["state"] == "stopped" and r["pid"] is None for r in status["roles"])


def test_the_routers_shutdown_lines_after_ctrl_c_carry_no_colour_codes_off_a_terminal(deployment):
    """The real sglang-router colours its log; a foreground `up` piped to a file showed `\\x1b[32m` in its
    shutdown lines."""
    ports = free_ports(8)
    up = deployment.start("up", epd_topology(deployment, ports))
    seen: list[str] = []
    wait_for(lambda: seen.append(up.stdout.readline()) or "ready in" in seen[-1] or not seen[-1], timeout=120)
    assert up.poll() is None, "".join(seen)
    up.send_signal(signal.SIGINT)
    output, _ = up.communicate(timeout=120)
    assert up.returncode == 130, "".join(seen) + output
    router = [line for line in output.splitlines() if line.startswith("router  |")]
    assert router, output  # the router said it was shutting down
    assert not any("x1b" in line or "\x1b" in line for line in router), router
    assert deployment.alive() == []
