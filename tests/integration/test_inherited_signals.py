"""Ctrl-C stops `logs -f` and a foreground `up` whatever signal dispositions their parent passed on: a
shell's `cmd &` starts a program with SIGINT and SIGQUIT ignored, and a parent that ignored or blocked a
signal hands that on through fork and exec. A role never inherits them either: `down` stops it with its
own stop signal, not by SIGKILL at the end of its grace."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from harness import REPO, free_ports, stand_in, wait_for

pytestmark = pytest.mark.integration

LOADED = 60  # seconds: a generous bound for a Python process to exit on a loaded 2-core machine
STOP_SIGNALS = {signal.SIGINT, signal.SIGQUIT, signal.SIGTERM}


def ignoring(*, ignored: bool, blocked: bool):
    """A preexec_fn: the child starts with SIGINT, SIGQUIT and SIGTERM ignored and/or blocked."""

    def preexec() -> None:
        if ignored:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
        if blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)

    return preexec


def sig_sets(pid: int) -> dict[str, set[int]]:
    """SigIgn and SigBlk of /proc/PID/status, as sets of signal numbers."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("SigIgn", "SigBlk"):
                mask = int(value.strip(), 16)
                out[key] = {n + 1 for n in range(64) if mask >> n & 1}
    return out


def muse(deployment, *args: str, preexec) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "muse_launch", *args],
        cwd=REPO,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=preexec,
    )


@pytest.mark.parametrize(
    "ignored,blocked", [(True, False), (False, True), (True, True)], ids=["ignored", "blocked", "both"]
)
def test_logs_follow_stops_on_ctrl_c_whatever_its_parent_ignored(deployment, ignored: bool, blocked: bool):
    (port,) = free_ports(1)
    topology = deployment.write({"server": stand_in(port)})
    assert deployment.cli("up", topology, "--detach").returncode == 0
    follow = muse(
        deployment,
        "logs",
        deployment.name,
        "-f",
        "-n",
        "1",
        preexec=ignoring(ignored=ignored, blocked=blocked),
    )
    try:
        assert "server |" in follow.stdout.readline()  # following now
        sets = sig_sets(follow.pid)
        assert not sets["SigIgn"] & STOP_SIGNALS and not sets["SigBlk"] & STOP_SIGNALS, sets
        follow.send_signal(signal.SIGINT)
        follow.communicate(timeout=LOADED)
        assert follow.returncode == 0
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()
    assert deployment.cli("down", deployment.name).returncode == 0


def test_foreground_up_stops_on_ctrl_c_and_its_role_on_its_own_stop_signal(deployment):
    """Started with SIGINT, SIGQUIT and SIGTERM ignored and blocked; the role stops on SIGQUIT with a grace
    longer than the test waits, so a role that inherited SIGQUIT ignored would be SIGKILLed (and said so)."""
    (port,) = free_ports(1)
    role = stand_in(port, stop={"signal": "SIGQUIT", "grace": 3 * LOADED})
    topology = deployment.write({"server": role})
    up = muse(deployment, "up", topology, preexec=ignoring(ignored=True, blocked=True))
    try:
        seen: list[str] = []
        wait_for(
            lambda: seen.append(up.stdout.readline()) or "ready in" in seen[-1] or not seen[-1],
            timeout=LOADED,
        )
        assert "ready in" in seen[-1], "".join(seen)
        for pid in (up.pid, deployment.role("server")["pid"]):
            sets = sig_sets(pid)
            assert not sets["SigIgn"] & STOP_SIGNALS and not sets["SigBlk"] & STOP_SIGNALS, (pid, sets)
        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=LOADED)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 130, output
    assert "SIGKILL" not in output, output
    assert deployment.status()["state"] == "stopped"
