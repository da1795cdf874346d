"""`down` stops exactly what `up` started (issue 9, items 1, 2, 3 and 5): not a session that took a dead
leader's pid, everything after a wall-clock step, a child that escaped its session and environment
(where cgroups are offered), and a role stopped by SIGSTOP without waiting out its grace."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys

import psutil
import pytest
from harness import free_ports, port_open, stand_in, wait_for

from muse_launch.proc import cgroups

pytestmark = pytest.mark.integration

PR_SET_CHILD_SUBREAPER = 36
BOTH_PATHS = pytest.mark.parametrize("contained", [True, False], ids=["cgroups", "no-cgroups"])


def use_cgroups(monkeypatch: pytest.MonkeyPatch, contained: bool) -> None:
    """The deployment's CLI runs with the switch set (Deployment.env copies os.environ)."""
    if contained and cgroups.create_role_cgroup("probe", "/probe", "probe") is None:
        pytest.skip("no cgroup v2 here that this user may create")
    if contained:
        cgroups.remove(cgroups.create_role_cgroup("probe", "/probe", "probe"))
    monkeypatch.setenv(cgroups.CGROUPS_SWITCH, "1" if contained else "0")


def up_detached(d, roles: dict) -> None:
    result = d.cli("up", d.write(roles), "--detach")
    assert result.returncode == 0, result.stdout + result.stderr


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def subreaper():
    """Orphans re-parent to this process, which can reap them (PID 1 here may never reap, and a pid is
    only reused once its zombie is gone)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("cannot become a child subreaper")
    try:
        yield
    finally:
        prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def kill_and_reap(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def spawn_with_pid(pid: int, argv: list[str], attempts: int = 200) -> subprocess.Popen:
    """A process that gets `pid`, as a reused pid would (ns_last_pid: the next fork gets the one after)."""
    for _ in range(attempts):
        try:
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(pid - 1))
        except OSError:
            pytest.skip("cannot set ns_last_pid here to reuse a pid")
        proc = subprocess.Popen(argv, start_new_session=False)
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    pytest.fail(f"could not get pid {pid} in {attempts} attempts (something else forks in between)")


@pytest.mark.faults("1. pid reuse: down spares a session that took a dead leader's pid")
@BOTH_PATHS
def test_down_spares_an_unrelated_session_that_reused_the_dead_leaders_pid(
    deployment, monkeypatch, contained
):
    use_cgroups(monkeypatch, contained)
    (port,) = free_ports(1)
    impostor = None
    with subreaper():
        try:
            up_detached(deployment, {"server": stand_in(port, stop={"grace": 2})})
            state = deployment.state_file()
            leader = state["roles"][0]["pid"]
            kill_and_reap(state["supervisor_pid"])  # the supervisor dies first: no one updates state.json
            kill_and_reap(leader)  # then the leader; its pid is free
            # An unrelated program gets the pid, starts its own session (sid == the dead leader's pid) and a
            # child.
            unrelated = (
                "import os, subprocess, time; os.setsid(); "
                "subprocess.Popen(['sleep', '600']); print('up', flush=True); time.sleep(600)"
            )
            impostor = spawn_with_pid(leader, [sys.executable, "-c", unrelated])
            wait_for(
                lambda: (
                    len(psutil.Process(impostor.pid).children()) == 1 and os.getsid(impostor.pid) == leader
                )
            )
            child = psutil.Process(impostor.pid).children()[0]

            down = deployment.cli("down", deployment.name)
            assert down.returncode == 0, down.stdout + down.stderr
            assert impostor.poll() is None, f"down killed the unrelated process that reused pid {leader}"
            assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE, "down killed its child"
            assert not port_open(port)
        finally:
            if impostor is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(impostor.pid, signal.SIGKILL)
                impostor.wait()


def shift_wall_clock_fields(d, seconds: float) -> None:
    """state.json as a clock step makes it look: every stored wall-clock time an hour away from the clock."""
    state = d.state_file()
    for holder in [state, *state["roles"]]:
        for key in ("create_time", "supervisor_create_time"):
            if holder.get(key):
                holder[key] += seconds
    (d.run_dir / "state.json").write_text(json.dumps(state))


@pytest.mark.faults("2. wall-clock step: down still stops every role (and the supervisor)")
@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["forward", "back"])
@BOTH_PATHS
def test_down_after_a_wall_clock_step_stops_everything(deployment, monkeypatch, contained, step):
    use_cgroups(monkeypatch, contained)
    ports = free_ports(2)
    up_detached(
        deployment,
        {
            "engine": stand_in(ports[0], "--retitled-child", stop={"grace": 2}),
            "router": stand_in(ports[1], after=["engine"]),
        },
    )
    log = deployment.run_dir / "logs" / "engine.log"
    child = int(wait_for(lambda: re.search(r"retitled (\d+)", log.read_text()))[1])
    wait_for(
        lambda: b"MUSE_LAUNCH" not in open(f"/proc/{child}/environ", "rb").read()
    )  # found by session only
    supervisor = deployment.status()["supervisor_pid"]
    shift_wall_clock_fields(deployment, step)
    assert deployment.status()["supervisor_pid"] == supervisor  # still recognised

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped router, engine" in down.stdout
    assert gone(child) and gone(supervisor), down.stdout
    assert deployment.alive() == []
    assert not port_open(ports[0]) and not port_open(ports[1])


@pytest.mark.faults("3. a child that double-forks, calls setsid and clears its environment")
def test_an_escaped_child_holding_a_port_is_stopped_through_the_roles_cgroup(deployment, monkeypatch):
    use_cgroups(monkeypatch, True)
    port, escape_port = free_ports(2)
    deployment.ports.add(escape_port)  # the fixture fails the test if it is still held
    up_detached(deployment, {"server": stand_in(port, "--escape-holding", escape_port, stop={"grace": 2})})
    wait_for(lambda: port_open(escape_port))
    role_cgroup = deployment.state_file()["roles"][0].get("cgroup")
    members = cgroups.members(role_cgroup)

    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not port_open(escape_port), f"the escaped child still holds port {escape_port}"
    assert cgroups.BEST_EFFORT_NOTE not in down.stdout
    assert len(members) == 2  # the server and its escaped descendant were in the role's cgroup
    assert cgroups.is_role_cgroup(role_cgroup) and not os.path.exists(role_cgroup)  # removed once empty
    assert deployment.alive() == []


def test_without_cgroups_down_says_containment_is_best_effort(deployment, monkeypatch):
    """The fallback (MUSE_LAUNCH_CGROUPS=0, or a host without cgroups): markers and sessions, and `down` says
    once what they cannot reach."""
    use_cgroups(monkeypatch, False)
    port, escape_port = free_ports(2)
    up_detached(
        deployment,
        {
            "server": stand_in(port, "--escape-holding", escape_port, stop={"grace": 2}),
            "other": stand_in(free_ports(1)[0]),
        },
    )
    wait_for(lambda: port_open(escape_port))
    assert all(r["cgroup"] is None for r in deployment.state_file()["roles"])
    log = deployment.run_dir / "logs" / "server.log"
    escaped = int(wait_for(lambda: re.search(r"escaped (\d+)", log.read_text()))[1])
    try:
        down = deployment.cli("down", deployment.name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert down.stdout.count(cgroups.BEST_EFFORT_NOTE) == 1, down.stdout
        # The next line says nothing is wrong, and what turns containment on (the switch the test set).
        after = down.stdout.split(cgroups.BEST_EFFORT_NOTE + "\n")[1].splitlines()[0]
        assert after == (
            "  fix: nothing is wrong; MUSE_LAUNCH_CGROUPS=0 turned cgroups off: "
            "unset it and `up` again to have them"
        )
        assert not port_open(port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(escaped, signal.SIGKILL)  # what the fallback cannot reach: not ours to leave behind
        wait_for(lambda: not port_open(escape_port))


@pytest.mark.faults("5. a role stopped by SIGSTOP: status shows it unhealthy, down needs no SIGKILL")
@BOTH_PATHS
def test_a_sigstopped_role_is_unhealthy_and_down_resumes_it_to_stop(deployment, monkeypatch, contained):
    use_cgroups(monkeypatch, contained)
    port, other = free_ports(2)
    up_detached(deployment, {"server": stand_in(port, stop={"grace": 300}), "other": stand_in(other)})
    pid = deployment.role("server")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED)
        status = deployment.status()
        server = next(r for r in status["roles"] if r["name"] == "server")
        assert server["state"] == "unhealthy" and server["health"] == "failing", server
        assert status["state"] == "degraded"
        # The supervisor notices too: it records the state, with the reason.
        recorded = lambda: next(r for r in deployment.state_file()["roles"] if r["name"] == "server")  # noqa: E731
        wait_for(lambda: recorded()["state"] == "unhealthy")
        assert "SIGSTOP" in recorded()["reason"]
        table = deployment.cli("status", deployment.name)
        assert "unhealthy" in table.stdout and "SIGSTOP" in table.stdout, table.stdout

        down = deployment.cli("down", deployment.name, timeout=240)  # well under its 300 s grace
        assert down.returncode == 0, down.stdout + down.stderr
        assert "had to SIGKILL" not in down.stdout, down.stdout  # SIGCONT let it act on its SIGTERM
        assert gone(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert deployment.alive() == []


@pytest.mark.faults("6. a damaged state.json and a dead supervisor: down still empties the role cgroups")
@pytest.mark.parametrize("where", ["same cgroup", "another cgroup"])
def test_down_without_state_empties_the_role_cgroups(deployment, monkeypatch, where):
    """The escaped child carries no marker and is in no role session: with the state gone, only the role's
    cgroup still knows it, also to a `down` run from another cgroup (another login's session scope)."""
    use_cgroups(monkeypatch, True)
    port, escape_port = free_ports(2)
    deployment.ports.add(escape_port)
    up_detached(deployment, {"server": stand_in(port, "--escape-holding", escape_port, stop={"grace": 2})})
    wait_for(lambda: port_open(escape_port))
    state = deployment.state_file()
    role_cgroup = state["roles"][0]["cgroup"]
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: gone(state["supervisor_pid"]))
    (deployment.run_dir / "state.json").write_text('{"name": "trunc')  # a full disk cut it short

    if where == "same cgroup":
        down = deployment.cli("down", deployment.name)
    else:
        other = cgroups.cgroup2_mount() / f"muse-launch-test-{os.getpid()}"
        other.mkdir()
        try:
            down = subprocess.run(
                [
                    "sh",
                    "-c",
                    f'echo $$ > {other}/cgroup.procs && exec "$@"',
                    "sh",
                    sys.executable,
                    "-m",
                    "muse_launch",
                    "down",
                    deployment.name,
                ],
                env=deployment.env,
                capture_output=True,
                text=True,
                timeout=60,
            )
        finally:
            other.rmdir()
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped the processes in the deployment's marker and its role cgroups" in down.stdout, down.stdout
    assert not port_open(escape_port), f"the escaped child still holds port {escape_port}"
    assert not os.path.exists(role_cgroup)
    assert deployment.alive() == []
