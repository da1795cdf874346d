"""The supervisor never blocks, against real misbehaving processes: probes that are accepted and
never answered, and a foreground `up` whose stdout nobody reads. The assertions are on the order
of what `up` reports and on states, never on durations (figures: scripts/bench_bringup.py)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time

import pytest
from harness import free_ports, stand_in, wait_for

pytestmark = pytest.mark.integration

HUNG = 5


def progress(up: subprocess.Popen, until: tuple[str, str], timeout: float = 60.0) -> list[str]:
    """`up`'s output lines, read until it reports the (role, state) `until`, or exits."""
    lines: list[str] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    fd = up.stdout.fileno()
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.5)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        *complete, buffer = (buffer + chunk).split(b"\n")
        lines += [line.decode() for line in complete]
        if until in changes(lines):
            break
    return lines


def changes(lines: list[str]) -> list[tuple[str, str]]:
    """(role, state) from the plain progress lines: `role  state  detail`."""
    out = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[1] in (
            "starting",
            "ready",
            "failed",
            "restarting",
            "stopping",
            "stopped",
        ):
            out.append((words[0], words[1]))
    return out


def hung_roles(ports: list[int]) -> dict:
    return {f"hung{i}": stand_in(port, "--hang", ready_timeout=600) for i, port in enumerate(ports)}


def interrupt(up: subprocess.Popen) -> str:
    up.send_signal(signal.SIGINT)
    rest, _ = up.communicate(timeout=60)
    return rest


def test_hung_probes_do_not_delay_another_roles_ready(deployment):
    *hung, quick, after_quick, late = free_ports(HUNG + 3)
    topology = deployment.write(
        {
            **hung_roles(hung),
            "quick": stand_in(quick, "--ready-after", 0.3),
            "next": stand_in(after_quick, "--ready-after", 0.3, after=["quick"]),
            "late": stand_in(late, "--ready-after", 5),  # a witness: ready 5 s after its start
        }
    )
    up = deployment.start("up", topology)
    try:
        seen = changes(progress(up, ("late", "ready")))
    finally:
        rest = interrupt(up)
    assert ("late", "ready") in seen, rest
    # Waiting in turn on five unanswered probes (2 s each) would see quick ready only with late, and next
    # after it.
    assert seen.index(("next", "ready")) < seen.index(("late", "ready"))
    assert not any(name.startswith("hung") and state != "starting" for name, state in seen)
    assert up.returncode == 128 + signal.SIGINT
    assert deployment.alive() == []


def test_hung_probes_do_not_delay_a_crash_report(deployment):
    *hung, late, crashing = free_ports(HUNG + 2)
    topology = deployment.write(
        {
            **hung_roles(hung),
            "late": stand_in(late, "--ready-after", 4),  # a witness, listed before the crashing role
            "crashing": stand_in(
                crashing, "--exit-during-startup", 3, "--exit-after", 1.0, ready_timeout=600
            ),
        }
    )
    up = deployment.start("up", topology)
    out, _ = up.communicate(timeout=120)
    assert up.returncode == 1, out
    assert "error: role crashing failed: exited with code 3 before it was ready" in out
    seen = changes(out.splitlines())
    assert ("late", "ready") not in seen  # reported before the witness, ready 3 s after the crash, was
    assert deployment.status()["state"] == "stopped"
    assert deployment.alive() == []


def test_a_blocked_stdout_does_not_stop_supervision(deployment, tmp_path):
    base, chatty, flaky = free_ports(3)
    topology = deployment.write(
        {
            "base": stand_in(base),
            "chatty": stand_in(
                chatty, "--spew", 1_000_000
            ),  # its log, printed by `up`, fills the pipe at once
            "flaky": stand_in(
                flaky,
                "--crash-after-ready",
                2.0,
                "--crash-once",
                tmp_path / "crashed",
                restart={"policy": "on-failure", "max": 2},
            ),
        }
    )
    up = deployment.start("up", topology)  # nobody reads its stdout until the end
    try:
        wait_for(lambda: (tmp_path / "crashed").exists(), timeout=30)
        flaky_role = wait_for(
            lambda: (r := deployment.role("flaky"))["restarts"] == 1 and r["state"] == "ready" and r,
            timeout=30,
        )
        assert flaky_role["pid"]
        up.send_signal(signal.SIGINT)
        # Teardown goes on with stdout still blocked.
        wait_for(
            lambda: (s := deployment.status())["state"] == "stopped" and s["supervisor_pid"] is None,
            timeout=60,
        )
        assert deployment.alive() == []
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)  # drains what it still had to say, so it can exit
    assert up.returncode == 128 + signal.SIGINT
