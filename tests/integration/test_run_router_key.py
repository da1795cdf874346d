"""A router given an API key (issue 18, item 9): the real sglang-router with `--api-key ${env:K}` answers its
worker list and inference with 401 unless asked with `Authorization: Bearer K`. The wiring check sends the
key the router was given, so `up` is ready as without one; `smoke` sends it too; the key is never written
in clear (state.json holds it masked)."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
from harness import ROUTER, STAND_IN, free_ports, port_open

pytestmark = pytest.mark.integration

KEY = "rk-Zq81-router-secret"


@pytest.mark.faults("18.9 a router with an API key becomes ready: the wiring check and smoke send its key")
def test_a_router_with_an_api_key_is_wired_and_smoked(deployment, monkeypatch):
    prefill, decode, router, metrics, boot = ports = free_ports(5)
    monkeypatch.setenv("ROUTER_KEY", KEY)
    probe = {"http": "/health", "interval": 0.05, "timeout": 30}
    topology = deployment.write(
        {
            "prefill": {"kind": "prefill", "port": prefill, "bootstrap_port": boot, "ready": probe},
            "decode": {"kind": "decode", "port": decode, "ready": probe},
            "router": {
                "kind": "router",
                "launcher": [ROUTER, "launch"],
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode"],
                "args": ["--api-key", "${env:ROUTER_KEY}"],
                "ready": {"http": "/readiness", "interval": 0.05, "timeout": 30},
            },
        },
        model=str(Path(STAND_IN).parent),
        launcher=[sys.executable, STAND_IN],
    )
    # The router really wants it: asked without the key, its worker list is refused.
    up = deployment.cli("up", topology, "--detach", timeout=90)
    assert up.returncode == 0, up.stdout + up.stderr
    assert httpx.get(f"http://127.0.0.1:{router}/workers", timeout=5).status_code == 401
    assert (
        httpx.get(
            f"http://127.0.0.1:{router}/workers", timeout=5, headers={"Authorization": f"Bearer {KEY}"}
        ).status_code
        == 200
    )

    status = deployment.cli("status", deployment.name)
    assert status.returncode == 0 and "1/1 prefill, 1/1 decode" in status.stdout, status.stdout
    smoke = deployment.cli("smoke", deployment.name, "--timeout", "10")
    assert "ok   models" in smoke.stdout, smoke.stdout  # not "HTTP 401": the stand-ins serve no chat after it
    assert "401" not in smoke.stdout, smoke.stdout

    written = "".join((deployment.run_dir / f).read_text() for f in ("state.json", "supervisor.log"))
    assert KEY not in up.stdout + up.stderr + status.stdout + smoke.stdout + written
    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert KEY not in down.stdout
    assert deployment.alive() == [] and not any(port_open(p) for p in ports)
