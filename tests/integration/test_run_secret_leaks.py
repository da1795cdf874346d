"""`${env:...}` secrets shown by other paths (issue 18, item 6): the holder of a busy port, when it is another
deployment's role, is described without the secret in its command line by `up` and `doctor`; a secret a
role prints in its log is hidden by `logs` as `up` hides it."""

from __future__ import annotations

import sys

import pytest
from harness import STAND_IN, Deployment, free_ports

pytestmark = pytest.mark.integration

SECRET = "pk-4Rt7-holder-secret"
LISTEN = (
    "import socket, sys, time; s = socket.create_server(('127.0.0.1', int(sys.argv[3])))\n"
    "print('connecting with key', sys.argv[2], 'and', sys.argv[2] + '!', flush=True)\n"
    "time.sleep(600)\n"
)


@pytest.mark.faults("18.6 secrets: a busy port's holder and a role's own log line shown without the secret")
def test_a_busy_ports_holder_and_a_logged_secret_are_masked(deployment, monkeypatch, tmp_path):
    (port,) = free_ports(1)
    monkeypatch.setenv("HOLDER_KEY", SECRET)
    script = tmp_path / "listen.py"
    script.write_text(LISTEN)
    holder = deployment.write(
        {
            "server": {
                "kind": "command",
                "port": port,
                "stop": {"grace": 2},
                "ready": {"tcp": True, "interval": 0.05},
                "command": [sys.executable, str(script), "--api-key", "${env:HOLDER_KEY}", "{port}"],
            }
        }
    )
    up = deployment.cli("up", holder, "--detach")
    assert up.returncode == 0, up.stdout + up.stderr

    logs = deployment.cli("logs", deployment.name)
    assert logs.returncode == 0, logs.stderr
    assert "connecting with key *** and" in logs.stdout, logs.stdout
    assert SECRET not in logs.stdout.replace(SECRET + "!", ""), logs.stdout  # the word itself is hidden

    # A second deployment, which knows nothing of HOLDER_KEY, wants the same port.
    monkeypatch.delenv("HOLDER_KEY")
    other = Deployment(deployment.home, deployment.name + "-2", ports={port})
    second = other.write(
        {
            "web": {
                "kind": "command",
                "port": port,
                "ready": {"tcp": True},
                "command": [sys.executable, STAND_IN, "--port", "{port}"],
            }
        }
    )
    refused = other.cli("up", second, "--detach")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    holder = f"(role server of {deployment.name}, python"  # its program: the rest may hold its secrets
    assert f"port {port} is in use by pid" in refused.stderr and holder in refused.stderr, refused.stderr
    doctor = other.cli("doctor", second)
    assert f"{port}: in use by pid" in doctor.stdout and holder in doctor.stdout, doctor.stdout
    for out in (refused.stdout, refused.stderr, doctor.stdout, doctor.stderr):
        assert SECRET not in out, out

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert deployment.alive() == [] and other.alive() == []
