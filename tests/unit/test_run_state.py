"""Role states, the state file, the lock and deployment names."""

from __future__ import annotations

import os
import stat
from dataclasses import replace

import pytest

from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
from muse_launch.proc.process import ProcessRef
from muse_launch.run.lifecycle import (
    DeploymentState,
    InvalidTransition,
    RoleState,
    deployment_state,
    transition,
)
from muse_launch.run.state import (
    DeploymentLock,
    RunDir,
    planned_record,
    read_state,
    resolve_name,
    write_state,
)


def test_transitions_are_guarded():
    assert transition(RoleState.PENDING, RoleState.STARTING) is RoleState.STARTING
    assert transition(RoleState.READY, RoleState.RESTARTING) is RoleState.RESTARTING
    with pytest.raises(InvalidTransition, match="from stopped to ready"):
        transition(RoleState.STOPPED, RoleState.READY)
    with pytest.raises(InvalidTransition):
        transition(RoleState.PENDING, RoleState.READY)


@pytest.mark.parametrize("states, expected", [
    ([RoleState.PENDING, RoleState.PENDING], DeploymentState.STOPPED),
    ([RoleState.READY, RoleState.STARTING, RoleState.PENDING], DeploymentState.STARTING),
    ([RoleState.READY, RoleState.READY], DeploymentState.READY),
    ([RoleState.READY, RoleState.RESTARTING], DeploymentState.DEGRADED),
    ([RoleState.READY, RoleState.FAILED], DeploymentState.DEGRADED),
    ([RoleState.STOPPED, RoleState.FAILED], DeploymentState.STOPPED),
    ([RoleState.READY, RoleState.STOPPING, RoleState.STOPPED], DeploymentState.STOPPING),
])
def test_deployment_state_follows_its_roles(states, expected):
    assert deployment_state(states) is expected


PLAN = Plan("demo", (
    LaunchSpec(name="prefill", role="prefill", kind="prefill", engine="sglang", launcher=("sglang", "serve"),
               args=(), host="10.0.0.5", bind="0.0.0.0", gpus=(0, 1), ports={"http": 30001, "bootstrap": 8998}),
    LaunchSpec(name="router", role="router", kind="router", engine="sglang-router", launcher=("sglang-router",),
               args=(), ports={"http": 8000}, probe=Probe(ProbeKind.HTTP, ("/readiness",)), depends_on=("prefill",)),
), (("prefill",), ("router",)))


def test_state_file_is_written_atomically_private_and_reads_back(tmp_path):
    run_dir = RunDir(tmp_path / "demo")
    record = planned_record(PLAN, "demo.yaml", lambda s: s.replace("10.0.0.5", "***"),
                            {"sglang": "0.5.23", "sglang-router": None})
    write_state(run_dir, record)
    assert stat.S_IMODE(os.stat(run_dir.state_file).st_mode) == 0o600
    assert [p.name for p in run_dir.path.iterdir()] == ["state.json"]  # no temporary file left
    again = read_state(run_dir)
    assert again == record
    assert again.role("prefill").url == "http://***:30001"  # a secret host stays masked
    assert again.role("prefill").probe_host == "127.0.0.1"  # bound to 0.0.0.0: reached on loopback
    assert again.stop_waves == (("router",), ("prefill",))
    assert again.versions == {"sglang": "0.5.23", "sglang-router": None}  # as `up` read them, for status
    assert again.status_dict() == {"name": "demo", "supervisor_pid": None, "state": "stopped", "roles": [
        {"name": "prefill", "kind": "prefill", "state": "pending", "pid": None, "pgid": None, "gpus": [0, 1],
         "url": "http://***:30001", "ports": {"http": 30001, "bootstrap": 8998}, "restarts": 0, "restarts_reset_after": 300.0, "ready_at": None,
         "wiring": {}},
        {"name": "router", "kind": "router", "state": "pending", "pid": None, "pgid": None, "gpus": [],
         "url": "http://127.0.0.1:8000", "ports": {"http": 8000}, "restarts": 0, "restarts_reset_after": 300.0, "ready_at": None,
         "wiring": {"prefill": "0/1"}},  # the router must list its prefill
    ]}


def test_a_second_lock_on_one_name_refuses_naming_the_supervisor(tmp_path, monkeypatch):
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    run_dir = RunDir.of("demo")
    record = planned_record(PLAN, "demo.yaml", str)
    write_state(run_dir, replace(record, supervisor=ProcessRef(4242, 1.0)))
    held = DeploymentLock(run_dir)
    with pytest.raises(RuntimeFailure, match=r"'demo' is already running \(supervisor pid 4242\); .*down demo"):
        DeploymentLock(run_dir)
    held.release()
    DeploymentLock(run_dir).release()


def test_names_resolve_from_a_name_a_file_or_the_one_running(tmp_path, monkeypatch):
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    with pytest.raises(RuntimeFailure, match="no deployment is running") as none:
        resolve_name(None)
    assert "muse-launch up" in none.value.fix
    write_state(RunDir.of("demo"), planned_record(PLAN, "demo.yaml", str))
    topology = tmp_path / "demo.yaml"
    topology.write_text("version: 1\nname: demo\nroles: {broken: yes}\n")  # still stoppable by its file
    assert resolve_name(str(topology)).name == "demo"
    assert resolve_name("demo").name == "demo"
    with pytest.raises(UsageError, match=r"no deployment named 'other' \(known: demo\)"):
        resolve_name("other")
