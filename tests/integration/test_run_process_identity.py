"""Process identity (proc/identity.py): start ticks and boot id, never the wall clock; legacy refs
(create_time only) are found but never trusted with a group or session; the role's cgroup layout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from muse_launch.proc import cgroups, identity
from muse_launch.proc.identity import ProcessRef, signal_if, start_ticks
from muse_launch.proc.process import Marker, StopTarget, role_processes

pytestmark = pytest.mark.integration  # starts processes


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.faults("2. wall-clock step: identity never reads the wall clock")
def test_identity_does_not_depend_on_the_wall_clock(monkeypatch, sleeper):
    ref = ProcessRef.of(sleeper.pid)
    assert ref.verified and ref.find() is not None
    # A step of an hour either way, as NTP or an operator makes it: psutil's create_time moves with it.
    for step in (3600.0, -3600.0):
        monkeypatch.setattr(time, "time", lambda step=step: time.monotonic() + 1e9 + step)
        monkeypatch.setattr(psutil, "boot_time", lambda step=step: 1e9 + step)
        assert ref.find() is not None and ref.is_running()
    shifted = ProcessRef(
        ref.pid, ref.start_ticks, ref.boot_id, ref.create_time + 3600
    )  # stored before a step
    assert shifted.find() is not None


def test_another_start_or_another_boot_is_someone_else(sleeper):
    ref = ProcessRef.of(sleeper.pid)
    assert ProcessRef(ref.pid, ref.start_ticks - 1, ref.boot_id).find() is None  # the pid, reused
    other_boot = ProcessRef(ref.pid, ref.start_ticks, "00000000-0000-0000-0000-000000000000")
    assert not other_boot.verified and other_boot.find() is None and not other_boot.send_signal(0)


def test_a_signal_goes_only_to_the_process_that_started_then(sleeper):
    ticks = start_ticks(sleeper.pid)
    assert not signal_if(sleeper.pid, ticks + 1, signal.SIGTERM)
    assert sleeper.poll() is None
    assert signal_if(sleeper.pid, ticks, signal.SIGTERM)
    assert sleeper.wait(5) == -signal.SIGTERM


def test_state_json_round_trip_and_legacy_refs(sleeper):
    ref = ProcessRef.of(sleeper.pid)
    assert ProcessRef.from_json(ref.pid, ref.to_json("supervisor_"), "supervisor_") == ref
    legacy = ProcessRef.from_json(ref.pid, {"create_time": ref.create_time})
    assert not legacy.verified and legacy.find() is not None  # still found, by its create time
    assert ProcessRef.from_json(None, {}) is None


def test_a_legacy_leader_is_stopped_but_its_session_is_never_trusted(sleeper):
    """A state file from before start ticks: the leader by create time, its group and session not
    signalled."""
    legacy = ProcessRef(sleeper.pid, create_time=psutil.Process(sleeper.pid).create_time())
    processes, pgid = role_processes(StopTarget("r", legacy), Marker("nobody", "/nowhere"))
    assert [p.pid for p in processes] == [sleeper.pid] and pgid is None
    verified = ProcessRef.of(sleeper.pid)
    processes, pgid = role_processes(StopTarget("r", verified), Marker("nobody", "/nowhere"))
    assert [p.pid for p in processes] == [sleeper.pid] and pgid == sleeper.pid


def test_a_dead_leaders_session_is_not_ours_without_a_member_of_ours(sleeper):
    """The sleeper leads a session; as a dead leader's record with its pid (older ticks), nothing of it is
    ours."""
    ticks = start_ticks(sleeper.pid)
    dead = ProcessRef(sleeper.pid, ticks - 1, identity.boot_id())  # our leader, gone; the pid reused since
    processes, pgid = role_processes(StopTarget("r", dead), Marker("nobody", "/nowhere"))
    assert processes == [] and pgid is None


def test_the_cgroup_layout_and_what_state_json_may_name(monkeypatch):
    mount = cgroups.cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 here")
    monkeypatch.setenv(cgroups.CGROUPS_SWITCH, "0")
    assert cgroups.deployment_dir("d", "/run/d") is None
    monkeypatch.setenv(cgroups.CGROUPS_SWITCH, "1")
    place = cgroups.deployment_dir("d", "/run/d")
    assert place.parent.name == cgroups.LAYOUT_DIR and place.name.startswith("d-")
    assert place != cgroups.deployment_dir("d", "/other/home/d")  # two homes, two cgroups
    assert cgroups.is_role_cgroup(place / "role")
    for foreign in (
        "/sys/fs/cgroup",
        str(mount),
        str(mount / "system.slice"),
        "/tmp/muse-launch/d-x/role",
        str(mount / cgroups.LAYOUT_DIR / ".." / ".." / "x"),
        None,
    ):
        assert not cgroups.is_role_cgroup(foreign), foreign
    assert cgroups.members(mount / "system.slice") == [] and not cgroups.kill(mount)


def test_a_role_cgroup_holds_what_the_role_spawns(monkeypatch, tmp_path):
    monkeypatch.setenv(cgroups.CGROUPS_SWITCH, "1")
    path = cgroups.create_role_cgroup("unit", str(tmp_path), "role")
    if path is None:
        pytest.skip("no cgroup v2 here that this user may create")
    fd = os.open(path / "cgroup.procs", os.O_WRONLY)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)",
            ],
            preexec_fn=lambda: os.write(fd, b"0"),
        )
    finally:
        os.close(fd)
    try:
        from harness import wait_for

        wait_for(lambda: len(cgroups.members(path)) == 2)
        assert cgroups.kill(path)
        assert proc.wait(5) == -signal.SIGKILL
        wait_for(lambda: cgroups.members(path) == [])
    finally:
        proc.kill()
        proc.wait()
        cgroups.remove(path)
    assert not path.exists()
