"""`down` reaches every process of a deployment: one ignoring SIGTERM, one that left its process
group, and all of them after the supervisor itself was SIGKILLed."""

from __future__ import annotations

import os
import re
import signal

import psutil
import pytest
from harness import free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration


def up_detached(d, roles: dict) -> None:
    result = d.cli("up", d.write(roles), "--detach")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_child_ignoring_sigterm_is_killed_after_its_grace(deployment):
    port, other = free_ports(2)
    up_detached(
        deployment,
        {"stubborn": stand_in(port, "--ignore-sigterm", stop={"grace": 1}), "polite": stand_in(other)},
    )
    stubborn_pid = deployment.role("stubborn")["pid"]

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert re.search(rf"had to SIGKILL:\n  stubborn: pid {stubborn_pid} \(.*server.py", down.stdout), (
        down.stdout
    )
    assert "polite" not in down.stdout.split("had to SIGKILL:")[1]
    assert deployment.alive() == []
    assert not port_open(port) and not port_open(other)


def test_a_grandchild_that_left_the_process_group_is_found(deployment):
    (port,) = free_ports(1)
    up_detached(deployment, {"escaper": stand_in(port, "--setsid-grandchild", stop={"grace": 2})})
    log = deployment.run_dir / "logs" / "escaper.log"
    grandchild = int(wait_for(lambda: re.search(r"escaped (\d+)", log.read_text()))[1])
    role_pid = deployment.role("escaper")["pid"]
    assert (
        os.getsid(grandchild) == grandchild != os.getpgid(role_pid)
    )  # its own session, outside the role's group

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    assert deployment.alive() == []


def test_a_retitled_child_is_stopped_after_its_parent_and_the_supervisor_died(deployment):
    """vLLM's EngineCore rewrites its title, which blanks the environ the marker lives in, and
    outlives a SIGKILLed API server (re-parented to PID 1): it is still found, by its session."""
    (port,) = free_ports(1)
    up_detached(deployment, {"engine": stand_in(port, "--retitled-child", stop={"grace": 2})})
    log = deployment.run_dir / "logs" / "engine.log"
    child = int(wait_for(lambda: re.search(r"retitled (\d+)", log.read_text()))[1])
    wait_for(lambda: b"MUSE_LAUNCH" not in open(f"/proc/{child}/environ", "rb").read())
    status = deployment.status()
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: deployment.status()["supervisor_pid"] is None)
    os.kill(status["roles"][0]["pid"], signal.SIGKILL)
    wait_for(lambda: psutil.Process(child).ppid() != status["roles"][0]["pid"])  # orphaned, like EngineCore

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE, down.stdout
    assert deployment.alive() == []


def test_down_after_the_supervisor_was_sigkilled(deployment):
    ports = free_ports(3)
    up_detached(
        deployment,
        {
            "a": stand_in(ports[0]),
            "b": stand_in(ports[1], "--setsid-grandchild", after=["a"]),
            "c": stand_in(ports[2], "--ignore-sigterm", after=["b"], stop={"grace": 1}),
        },
    )
    status = deployment.status()
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: deployment.status()["supervisor_pid"] is None)
    status = deployment.status()
    assert [r["state"] for r in status["roles"]] == ["ready"] * 3  # the roles live on, unsupervised
    assert status["state"] == "ready"
    alive_before = {p.pid for p in deployment.alive()}
    assert len(alive_before) == 4  # three roles and b's escaped grandchild

    down = deployment.cli("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped c, b, a in" in down.stdout
    assert "had to SIGKILL:\n  c: pid" in down.stdout
    assert deployment.alive() == []
    assert not any(port_open(p) for p in ports)
    assert deployment.status()["state"] == "stopped"
