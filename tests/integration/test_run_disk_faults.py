"""A full disk or a read-only run directory under a running deployment (issue 9, item 7): the supervisor
keeps supervising with its state in memory (one warning, writes tried again), and `down` stops everything
without writing. And `up -d` after the supervisor died names the roles still running.

The faults are real: a tiny tmpfs that fills up, or a read-only bind mount over the run directory, made in
a private mount namespace that a helper process holds; the CLI runs in it through `nsenter`, so nothing
of it touches the host's mounts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
from harness import REPO, free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration

WARNING = "cannot write"


@pytest.fixture
def mount_ns():
    """The pid of a process alone in a private mount namespace (skips where one cannot be made)."""
    try:
        holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
    except OSError:
        pytest.skip("no unshare(1)")
    own = os.readlink("/proc/self/ns/mnt")
    try:
        wait_for(
            lambda: holder.poll() is not None or os.readlink(f"/proc/{holder.pid}/ns/mnt") != own, timeout=10
        )
        if holder.poll() is not None:
            pytest.skip("cannot make a mount namespace here (not root?)")
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def in_ns(pid: int, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", *command], capture_output=True, text=True, check=check
    )


def cli(d, pid: int, *args, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", sys.executable, "-m", "muse_launch", *map(str, args)],
        env=d.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start(d, pid: int, *args) -> subprocess.Popen:
    return subprocess.Popen(
        ["nsenter", "-t", str(pid), "-m", sys.executable, "-m", "muse_launch", *map(str, args)],
        env=d.env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def state(d, pid: int) -> dict:
    return json.loads(in_ns(pid, "cat", str(d.run_dir / "state.json")).stdout)


def role_pids(d, role: str) -> set[int]:
    """Live processes carrying the deployment's marker for `role` (what `down` finds without the state)."""
    found = set()
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if (
                env.get("MUSE_LAUNCH_RUN_DIR") == str(d.run_dir)
                and env.get("MUSE_LAUNCH_ROLE") == role
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def fill(d, pid: int) -> None:
    """Use up the run directory's tmpfs to the last block (`cat` stops at ENOSPC)."""
    in_ns(pid, "sh", "-c", f"cat /dev/zero > {d.run_dir}/filler", check=False)
    assert in_ns(pid, "sh", "-c", f"echo x > {d.run_dir}/probe", check=False).returncode != 0, (
        "the disk is not full"
    )


@pytest.mark.faults("7. a full disk or a read-only run directory under a running deployment")
@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_the_supervisor_supervises_on_a_full_or_read_only_disk_and_down_stops_everything(
    deployment, mount_ns, fault
):
    d, ns = deployment, mount_ns
    steady_port, flaky_port = free_ports(2)
    file = d.write(
        {
            "steady": stand_in(steady_port),
            "flaky": stand_in(flaky_port, after=["steady"], restart={"policy": "on-failure", "max": 3}),
        }
    )
    d.run_dir.mkdir()
    if fault == "full":  # state, lock and supervisor.log on a 64 KiB tmpfs; the logs on one of their own
        in_ns(ns, "mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(d.run_dir))
        in_ns(ns, "mkdir", str(d.run_dir / "logs"))
        in_ns(ns, "mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d.run_dir / "logs"))
    # Foreground: its warning goes to the terminal (here, a pipe) and cannot be lost to the full disk.
    up = start(d, ns, "up", file) if fault == "full" else None
    try:
        supervise_and_stop(d, ns, file, fault, up, steady_port, flaky_port)
    finally:
        if up is not None and up.poll() is None:
            up.kill()
            print(up.communicate()[0])  # shown when the test fails
        elif up is not None and up.stdout and not up.stdout.closed:
            print(up.stdout.read())


def supervise_and_stop(
    d, ns: int, file, fault: str, up: subprocess.Popen | None, steady_port: int, flaky_port: int
) -> None:
    if up is None:
        result = cli(d, ns, "up", file, "--detach")
        assert result.returncode == 0, result.stdout + result.stderr
    wait_for(
        lambda: (
            state(d, ns)["state"] == "ready"
            if in_ns(ns, "test", "-s", str(d.run_dir / "state.json"), check=False).returncode == 0
            else False
        ),
        timeout=60,
    )
    first = state(d, ns)
    supervisor = first["supervisor_pid"]
    old = {r["name"]: r["pid"] for r in first["roles"]}
    d.sessions.update(old.values())

    if fault == "full":
        fill(d, ns)
    else:  # a read-only mount over the run directory: every new open for writing there fails (EROFS)
        in_ns(ns, "mount", "--bind", str(d.run_dir), str(d.run_dir))
        in_ns(ns, "mount", "-o", "remount,bind,ro", str(d.run_dir))
        assert in_ns(ns, "touch", str(d.run_dir / "probe"), check=False).returncode != 0

    os.kill(old["flaky"], signal.SIGKILL)  # a crash: the next state write fails, and a restart is due
    restarted = wait_for(
        lambda: (pids := role_pids(d, "flaky") - {old["flaky"]}) and port_open(flaky_port) and pids,
        timeout=30,
    )
    d.sessions.update(restarted)
    assert psutil.pid_exists(supervisor) and psutil.Process(supervisor).status() != psutil.STATUS_ZOMBIE
    status = cli(d, ns, "status", d.name)  # from the state last written
    assert status.returncode == 0, status.stdout + status.stderr
    assert "flaky" in status.stdout and "Traceback" not in status.stdout + status.stderr

    if fault == "full":  # space again: the record kept in memory is written at the next retry
        in_ns(ns, "rm", str(d.run_dir / "filler"))
        wait_for(
            lambda: (
                (flaky := next(r for r in state(d, ns)["roles"] if r["name"] == "flaky"))["pid"] in restarted
                and flaky["restarts"] == 1
            ),
            timeout=20,
        )
        fill(d, ns)  # and full again for `down`
    else:
        log = (d.run_dir / "supervisor.log").read_text()  # it was open before the disk went read-only
        assert log.count(WARNING) == 1, log

    down = cli(d, ns, "down", d.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "Traceback" not in down.stdout + down.stderr and "stopped" in down.stdout
    if up is not None:
        out, _ = up.communicate(timeout=120)
        assert out.count(WARNING) == 1, out  # one warning, however many writes failed
        assert "Traceback" not in out
    assert not port_open(steady_port) and not port_open(flaky_port)
    assert d.alive() == []


@pytest.mark.faults("also: up -d after the supervisor died names the roles still running")
def test_up_again_after_the_supervisor_was_killed_names_the_roles_still_running(deployment):
    d = deployment
    one, two = free_ports(2)
    file = d.write({"alpha": stand_in(one), "beta": stand_in(two, after=["alpha"])})
    result = d.cli("up", file, "--detach")
    assert result.returncode == 0, result.stdout + result.stderr
    status = d.status()
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    wait_for(
        lambda: (
            not psutil.pid_exists(status["supervisor_pid"])
            or psutil.Process(status["supervisor_pid"]).status() == psutil.STATUS_ZOMBIE
        )
    )
    before = role_pids(d, "alpha") | role_pids(d, "beta")

    again = d.cli("up", file, "--detach")
    said = again.stdout + again.stderr
    assert again.returncode == 1, said
    assert "alpha" in said and "beta" in said and "still" in said and "running" in said, said
    assert f"fix: `muse-launch down {d.name}`" in said, said
    assert "Traceback" not in said
    assert role_pids(d, "alpha") | role_pids(d, "beta") == before  # no duplicates started

    down = d.cli("down", d.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert d.alive() == []
