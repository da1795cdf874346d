"""A killed `up -d` (issue 18, item 5): the client waiting for a detached start-up is signalled (SIGTERM as
`timeout` sends it, SIGHUP, SIGINT) or loses its terminal while a role is still starting. The supervisor
outlives it (it stops writing to the client, never crashing on EPIPE), the role becomes ready under it, and
the client says what it left running."""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import subprocess
import sys
import termios

import psutil
import pytest
from harness import REPO, free_ports, stand_in, wait_for

pytestmark = pytest.mark.integration


def supervisor_of(deployment) -> int | None:
    try:
        return deployment.state_file().get("supervisor_pid")
    except (OSError, ValueError):
        return None


def start_client(deployment, topology, terminal: bool) -> tuple[subprocess.Popen, int | None]:
    command = [sys.executable, "-m", "muse_launch", "up", str(topology), "--detach"]
    if not terminal:
        return subprocess.Popen(
            command, env=deployment.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ), None
    master, slave = pty.openpty()

    def controlling_terminal() -> None:  # a login shell's child: the pty is its controlling terminal
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    client = subprocess.Popen(
        command,
        env=deployment.env,
        cwd=REPO,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=controlling_terminal,
    )
    os.close(slave)
    return client, master


@pytest.mark.faults(
    "18.5 up -d killed (SIGTERM, SIGHUP, SIGINT, its terminal closed) while starting: the supervisor lives on"
)
@pytest.mark.parametrize("how", ["SIGTERM", "SIGHUP", "SIGINT", "terminal closed"])
def test_a_killed_up_detach_leaves_its_supervisor_running(deployment, tmp_path, how):
    (port,) = free_ports(1)
    gate = tmp_path / "bind-now"
    topology = deployment.write(
        {"server": stand_in(port, "--bind-when", gate, ready_timeout=60, stop={"grace": 2})}
    )
    client, master = start_client(deployment, topology, terminal=how == "terminal closed")
    output = ""
    try:
        supervisor = wait_for(lambda: supervisor_of(deployment))
        wait_for(lambda: deployment.state_file()["roles"][0]["state"] == "starting")
        if master is None:
            client.send_signal(signal.Signals[how])
            output, _ = client.communicate(timeout=30)
        else:
            os.close(master)  # the terminal closes: the kernel sends SIGHUP to the client
            master = None
            client.wait(timeout=30)
    finally:
        if master is not None:
            os.close(master)
        if client.poll() is None:
            client.kill()
            client.wait()
    expected = signal.SIGHUP if how == "terminal closed" else signal.Signals[how]
    assert client.returncode == 128 + expected, output
    if how != "terminal closed":
        left = f"{expected.name}: stopped waiting; deployment {deployment.name} is left running"
        assert left in output, output
        assert f"(pid {supervisor})" in output and f"down {deployment.name}` stops it" in output, output
        assert "Traceback" not in output

    gate.touch()  # the role can start now: its supervisor, alone, sees it ready
    wait_for(lambda: deployment.role("server")["state"] == "ready", timeout=60)
    status = deployment.status()
    assert status["supervisor_pid"] == supervisor and psutil.pid_exists(supervisor), status
    assert "Traceback" not in (deployment.run_dir / "supervisor.log").read_text()
    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "no supervisor was running" not in down.stdout, down.stdout
    assert deployment.alive() == []
