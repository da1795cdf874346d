"""`up` when something goes wrong while starting: what the user sees, and nothing left behind."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
from harness import free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration


def chain(d, last: dict, **extra) -> Path:
    """first (ready at once) -> last, the role under test."""
    first, port = free_ports(2)
    return d.write(
        {"first": stand_in(first), "last": {**stand_in(port), **last, "after": ["first"]}}, **extra
    )


def test_a_role_exiting_during_startup_fails_at_once_with_its_log(deployment):
    ports = free_ports(2)
    topology = deployment.write(
        {
            "first": stand_in(ports[0]),
            "broken": stand_in(ports[1], "--exit-during-startup", 3, ready_timeout=600, after=["first"]),
        }
    )
    started = time.monotonic()
    up = deployment.cli("up", topology, timeout=300)
    assert up.returncode == 1, up.stdout + up.stderr
    assert (
        time.monotonic() - started < 300
    )  # at the exit, not at the 600 s timeout (a loaded machine is slow)
    assert "role broken failed: exited with code 3 before it was ready" in up.stdout
    assert "broken | failing during startup with exit code 3" in up.stdout  # the last lines of its log
    assert "stopping everything started" in up.stdout

    status = deployment.status()
    assert status["state"] == "stopped" and status["supervisor_pid"] is None
    assert {r["name"]: r["state"] for r in status["roles"]} == {"first": "stopped", "broken": "failed"}
    assert deployment.alive() == []
    assert not port_open(ports[0])


def test_a_role_that_never_becomes_ready_times_out(deployment):
    topology = chain(
        deployment,
        {
            "command": stand_in(0, "--never-ready")["command"],
            "ready": {"http": "/health", "interval": 0.05, "timeout": 1.5},
        },
    )
    up = deployment.cli("up", topology, "--detach")
    assert up.returncode == 1, up.stdout + up.stderr
    assert "role last failed: not ready after 1.5s (GET /health answered 503)" in up.stdout
    assert {r["name"]: r["state"] for r in deployment.status()["roles"]} == {
        "first": "stopped",
        "last": "failed",
    }
    assert deployment.alive() == []


def test_keep_leaves_the_started_roles_running_for_down(deployment):
    topology = chain(deployment, {"command": stand_in(0, "--exit-during-startup", 5)["command"]})
    up = deployment.cli("up", topology, "--detach", "--keep")
    assert up.returncode == 1, up.stdout + up.stderr
    assert "--keep" in up.stdout
    status = deployment.status()
    assert {r["name"]: r["state"] for r in status["roles"]} == {"first": "ready", "last": "failed"}
    assert status["state"] == "degraded" and status["supervisor_pid"] is None
    assert len(deployment.alive()) == 1

    again = deployment.cli("up", topology, "--detach")
    assert again.returncode == 1 and "still has processes from an earlier run" in again.stderr

    down = deployment.cli("down")  # the one deployment running: no name needed
    assert down.returncode == 0, down.stdout + down.stderr
    assert deployment.alive() == []


def test_a_busy_port_is_refused_naming_its_holder(deployment):
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        topology = chain(deployment, {"port": port})
        up = deployment.cli("up", topology)
    finally:
        holder.close()
    assert up.returncode == 1
    assert f"roles.last http port {port} is in use by pid {__import__('os').getpid()}" in up.stderr
    assert "Traceback" not in up.stderr
    assert deployment.alive() == []


def test_a_second_up_of_a_running_unchanged_file_does_nothing(deployment):
    topology = chain(deployment, {})
    first = deployment.cli("up", topology, "--detach")
    assert first.returncode == 0, first.stdout + first.stderr
    before = deployment.status()

    second = deployment.cli("up", topology, "--detach")  # an edited file is applied (docs/apply.md)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"{deployment.name}: running, and {topology} changes nothing of it; nothing to do" in second.stdout
    after = deployment.status()
    assert after["state"] == "ready" and after["supervisor_pid"] == before["supervisor_pid"]  # untouched
    assert [r["pid"] for r in after["roles"]] == [r["pid"] for r in before["roles"]]

    assert deployment.cli("down", deployment.name).returncode == 0
    assert deployment.alive() == []


def test_ctrl_c_during_startup_stops_everything(deployment):
    topology = chain(deployment, {"command": stand_in(0, "--ready-after", 30)["command"]})
    up = deployment.start("up", topology)
    wait_for(
        lambda: (
            (deployment.run_dir / "state.json").exists() and deployment.role("last")["state"] == "starting"
        )
    )
    up.send_signal(signal.SIGINT)
    output, _ = up.communicate(timeout=120)
    assert up.returncode == 130, output
    assert "SIGINT: stopping everything" in output
    status = deployment.status()
    assert status["state"] == "stopped" and status["supervisor_pid"] is None
    assert deployment.alive() == []


def test_a_second_ctrl_c_kills_what_ignores_sigterm(deployment):
    topology = chain(
        deployment,
        {"command": stand_in(0, "--ignore-sigterm", "--never-ready")["command"], "stop": {"grace": 600}},
    )
    up = deployment.start("up", topology)
    log = deployment.run_dir / "logs" / "last.log"
    # starting, and past the point where it ignores SIGTERM (it says so once it listens): on a loaded
    # machine a SIGTERM that reaches it before then ends it at once, and there is no grace to wait out
    wait_for(
        lambda: (
            (deployment.run_dir / "state.json").exists()
            and deployment.role("last")["state"] == "starting"
            and log.exists()
            and "stand-in pid" in log.read_text(errors="replace")
        ),
        timeout=120,
    )
    up.send_signal(signal.SIGINT)
    seen: list[str] = []  # the first Ctrl-C handled (two sent at once could arrive as one)
    wait_for(lambda: seen.append(up.stdout.readline()) or "stopping everything" in seen[-1] or not seen[-1])
    assert up.poll() is None, "".join(seen)  # waiting out the grace of a role that ignores SIGTERM
    up.send_signal(signal.SIGINT)
    output, _ = up.communicate(timeout=300)  # well under the 600 s grace: it was the second Ctrl-C
    output = "".join(seen) + output
    assert up.returncode == 130, output
    assert "had to SIGKILL:" in output and "last: pid" in output
    assert deployment.alive() == []
