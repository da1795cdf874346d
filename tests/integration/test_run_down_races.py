"""`down` racing an `up` that is still checking or starting, and two `down`s at once (issue 9, item 9):
no "already running", no traceback, both return 0, and nothing of the deployment is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO, free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration


def run(d, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "muse_launch", *map(str, args)],
        env=d.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def sleeping(pid: int) -> bool:
    """Whether process `pid` sleeps in a timed wait (its wchan: Python's time.sleep)."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=120)
    assert "Traceback" not in out and "internal error" not in out, out
    return proc.returncode, out


def roles(ports: list[int]) -> dict:
    """Three roles in three waves, each a little slow to get ready: `up` spends a while starting them."""
    a, b, c = ports
    return {
        "a": stand_in(a, "--ready-after", 0.3),
        "b": stand_in(b, "--ready-after", 0.3, after=["a"]),
        "c": stand_in(c, "--ready-after", 0.3, after=["b"]),
    }


def holds_the_deployment(d, up: subprocess.Popen) -> None:
    """`up` holds the deployment: its checks begin (or it ended already)."""
    wait_for(lambda: (d.run_dir / "lock").exists() or up.poll() is not None, interval=0.005)


# Where in `up` the `down` comes: each a moment `up` reaches (waited for, never a delay that a loaded machine
# would shift), from its checks to the last wave's start.
MOMENTS = {
    "in its checks": -1,
    "a listening": 0,  # the first wave started, not ready yet (--ready-after)
    "b listening": 1,
    "c listening": 2,
}


@pytest.mark.faults("9. down racing up (0-0.5 s into it), and two downs at once")
@pytest.mark.parametrize("moment", list(MOMENTS))
@pytest.mark.parametrize("detach", [True, False], ids=["up -d", "up"])
def test_down_during_up_stops_what_up_started(deployment, moment, detach):
    d = deployment
    ports = free_ports(3)
    file = d.write(roles(ports))
    up = run(d, "up", file, *(["--detach"] if detach else []))
    try:
        holds_the_deployment(d, up)
        if (role := MOMENTS[moment]) >= 0:
            wait_for(lambda: port_open(ports[role]) or up.poll() is not None, interval=0.005)
        down_code, down_out = finish(run(d, "down", d.name))
        assert down_code == 0, down_out
        assert "already running" not in down_out
        up_code, up_out = finish(up)
    finally:
        if up.poll() is None:
            up.kill()
    assert "already running" not in up_out
    if up_code != 0:  # stopped before it was ready: it says who stopped it
        assert "down" in up_out, up_out
    assert not any(port_open(p) for p in ports)
    assert d.alive() == []


@pytest.mark.faults("9. down racing up (0-0.5 s into it), and two downs at once")
@pytest.mark.parametrize("during_up", [False, True], ids=["after ready", "during up"])
def test_two_downs_at_once_both_return_0_and_leave_nothing(deployment, during_up):
    d = deployment
    ports = free_ports(3)
    file = d.write(roles(ports))
    up = run(d, "up", file, "--detach")
    try:
        if during_up:  # the first wave started, its role not ready yet
            holds_the_deployment(d, up)
            wait_for(lambda: port_open(ports[0]) or up.poll() is not None, interval=0.005)
        else:
            assert finish(up)[0] == 0
        downs = [run(d, "down", d.name) for _ in range(2)]
        results = [finish(p) for p in downs]
        finish(up)
    finally:
        if up.poll() is None:
            up.kill()
    for code, out in results:
        assert code == 0, out
        assert "already running" not in out
    assert not any(port_open(p) for p in ports)
    assert d.alive() == []


@pytest.mark.faults("9. down racing up (0-0.5 s into it), and two downs at once")
def test_down_waits_for_an_up_held_in_its_checks(deployment):
    """`up` holds the deployment's lock through its checks, before any supervisor exists: `down` waits
    for it (here it is paused, SIGSTOP, right after it took the lock), then stops what it started."""
    d = deployment
    ports = free_ports(3)
    up = run(d, "up", d.write(roles(ports)), "--detach")
    try:
        wait_for(lambda: (d.run_dir / "lock").exists() or up.poll() is not None, interval=0.002)
        os.kill(up.pid, signal.SIGSTOP)
        down = run(d, "down", d.name)
        # `down` reaches its wait for the lock (the first sleep on its way: the poll of the lock), and waits
        # there, not "already running"; a loaded machine only makes it arrive later.
        wait_for(lambda: sleeping(down.pid) or down.poll() is not None, interval=0.002)
        assert down.poll() is None, down.communicate()[0]
        os.kill(up.pid, signal.SIGCONT)
        down_code, down_out = finish(down)
        up_code, up_out = finish(up)
    finally:
        if up.poll() is None:
            os.kill(up.pid, signal.SIGCONT)
            up.kill()
    assert down_code == 0, down_out
    assert up_code in (0, 1) and "already running" not in up_out, up_out
    assert not any(port_open(p) for p in ports)
    assert d.alive() == []
