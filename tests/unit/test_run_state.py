"""Role states, the state file, the lock and deployment names."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace

import pytest

from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
from muse_launch.proc.process import ProcessRef
from muse_launch.rundir.lifecycle import (
    DeploymentState,
    InvalidTransition,
    RoleState,
    deployment_state,
    transition,
)
from muse_launch.rundir.state import DeploymentLock, RunDir, read_state, resolve_name, write_state
from muse_launch.supervise.planned_record import planned_record


def test_transitions_are_guarded():
    assert transition(RoleState.PENDING, RoleState.STARTING) is RoleState.STARTING
    assert transition(RoleState.READY, RoleState.RESTARTING) is RoleState.RESTARTING
    with pytest.raises(InvalidTransition, match="from stopped to ready"):
        transition(RoleState.STOPPED, RoleState.READY)
    with pytest.raises(InvalidTransition):
        transition(RoleState.PENDING, RoleState.READY)


@pytest.mark.parametrize(
    "states, expected",
    [
        ([RoleState.PENDING, RoleState.PENDING], DeploymentState.STOPPED),
        ([RoleState.READY, RoleState.STARTING, RoleState.PENDING], DeploymentState.STARTING),
        ([RoleState.READY, RoleState.READY], DeploymentState.READY),
        ([RoleState.READY, RoleState.RESTARTING], DeploymentState.DEGRADED),
        ([RoleState.READY, RoleState.FAILED], DeploymentState.DEGRADED),
        ([RoleState.STOPPED, RoleState.FAILED], DeploymentState.STOPPED),
        ([RoleState.READY, RoleState.STOPPING, RoleState.STOPPED], DeploymentState.STOPPING),
    ],
)
def test_deployment_state_follows_its_roles(states, expected):
    assert deployment_state(states) is expected


PLAN = Plan(
    "demo",
    (
        LaunchSpec(
            name="prefill",
            role="prefill",
            kind="prefill",
            engine="sglang",
            launcher=("sglang", "serve"),
            args=(),
            host="10.0.0.5",
            bind="0.0.0.0",
            gpus=(0, 1),
            ports={"http": 30001, "bootstrap": 8998},
        ),
        LaunchSpec(
            name="router",
            role="router",
            kind="router",
            engine="sglang-router",
            launcher=("sglang-router",),
            args=(),
            ports={"http": 8000},
            probe=Probe(ProbeKind.HTTP, ("/readiness",)),
            depends_on=("prefill",),
        ),
    ),
    (("prefill",), ("router",)),
)


def test_state_file_is_written_atomically_private_and_reads_back(tmp_path):
    run_dir = RunDir(tmp_path / "demo")
    record = planned_record(
        PLAN, "demo.yaml", lambda s: s.replace("10.0.0.5", "***"), {"sglang": "0.5.23", "sglang-router": None}
    )
    write_state(run_dir, record)
    assert stat.S_IMODE(os.stat(run_dir.state_file).st_mode) == 0o600
    assert [p.name for p in run_dir.path.iterdir()] == ["state.json"]  # no temporary file left
    again = read_state(run_dir)
    assert again == record
    assert again.role("prefill").url == "http://***:30001"  # a secret host stays masked
    assert again.role("prefill").probe_host == "127.0.0.1"  # bound to 0.0.0.0: reached on loopback
    assert again.stop_waves == (("router",), ("prefill",))
    assert again.versions == {"sglang": "0.5.23", "sglang-router": None}  # as `up` read them, for status
    assert again.status_dict() == {
        "name": "demo",
        "supervisor_pid": None,
        "state": "stopped",
        "roles": [
            {
                "name": "prefill",
                "kind": "prefill",
                "state": "pending",
                "pid": None,
                "pgid": None,
                "gpus": [0, 1],
                "url": "http://***:30001",
                "ports": {"http": 30001, "bootstrap": 8998},
                "restarts": 0,
                "restarts_reset_after": 300.0,
                "ready_at": None,
                "wiring": {},
                "generation": 0,
            },
            {
                "name": "router",
                "kind": "router",
                "state": "pending",
                "pid": None,
                "pgid": None,
                "gpus": [],
                "url": "http://127.0.0.1:8000",
                "ports": {"http": 8000},
                "restarts": 0,
                "restarts_reset_after": 300.0,
                "ready_at": None,
                "wiring": {"prefill": "0/1"},
                "generation": 0,
            },  # the router must list its prefill
        ],
        "change": None,
    }


def test_a_second_lock_on_one_name_refuses_naming_the_supervisor(tmp_path, monkeypatch):
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    run_dir = RunDir.of("demo")
    record = planned_record(PLAN, "demo.yaml", str)
    write_state(run_dir, replace(record, supervisor=ProcessRef(4242, 1)))
    held = DeploymentLock(run_dir)
    with pytest.raises(
        RuntimeFailure, match=r"'demo' is already running \(supervisor pid 4242\); .*down demo"
    ):
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


def _damaged_by(tmp_path, change) -> str:
    from muse_launch.rundir.state import StateDamaged

    run_dir = RunDir(tmp_path / "demo")
    write_state(run_dir, planned_record(PLAN, "demo.yaml", str))
    data = json.loads(run_dir.state_file.read_text())
    text = change(data)
    run_dir.state_file.write_text(text if isinstance(text, str) else json.dumps(data))
    with pytest.raises(StateDamaged) as caught:
        read_state(run_dir)
    return str(caught.value)


def _role(key, value):
    return lambda d: d["roles"][0].__setitem__(key, value)


@pytest.mark.faults("18.4 a damaged state.json: every field checked, size and depth bounded before parsing")
@pytest.mark.parametrize(
    "change, problem",
    [
        (_role("start_ticks", "x"), "roles.0.start_ticks"),
        (_role("pid", True), "roles.0.pid"),  # not 1
        (_role("ports", {"http": "30001"}), "roles.0.ports.http"),
        (_role("ports", {"http": 70000}), "port 70000"),
        (_role("stop", {"signal": "SIGCONT", "grace": 1}), "roles.0.stop.signal"),
        (_role("stop", {"signal": "SIGTERM", "grace": 1e300}), "roles.0.stop.grace"),
        (_role("ready_at", 17), "roles.0.ready_at"),
        (_role("started_at", "yesterday"), "not an ISO 8601 time"),
        (_role("url", ["http://x"]), "roles.0.url"),
        (_role("url", "file:///etc/passwd"), "not an http(s) URL"),
        (_role("wiring_counts", [["worker", "1", 2]]), "roles.0.wiring_counts"),
        (_role("cgroup", "/sys/fs/cgroup/user.slice"), "not the role's own"),
        (
            _role("probe", {"kind": "http", "paths": ["/x\nGET /y"], "timeout": 1, "interval": 1}),
            "control character",
        ),
        (_role("probe", {"kind": "tcp", "timeout": float("nan"), "interval": 1}), "roles.0.probe"),
        (_role("start_ticks", 5), "roles.0.start_ticks: set for no process"),
        (_role("backdoor", 1), "roles.0: unknown key 'backdoor'"),
        (lambda d: d.pop("masks"), "top level: no 'masks'"),
        (lambda d: d["stop_waves"].insert(0, ["ghost"]), "a stop wave names no role: 'ghost'"),
        (lambda d: d["stop_waves"].pop(), "do not list every role"),
        (lambda d: d.__setitem__("name", "other"), "names deployment 'other'"),
        (lambda d: d.__setitem__("roles", {}), "roles"),
        (lambda d: "[" * 100_000 + "]" * 100_000, "nested more than 16 deep"),
        (lambda d: '"' + "x" * (9 << 20) + '"', "larger than 8 MiB"),
        (lambda d: "[1, 2]", "a JSON list, not an object"),
    ],
)
def test_a_damaged_state_is_named_damaged_never_a_crash(tmp_path, change, problem):
    assert problem in _damaged_by(tmp_path, change)


def test_brackets_inside_strings_do_not_count_as_depth(tmp_path):
    run_dir = RunDir(tmp_path / "demo")
    record = planned_record(
        replace(PLAN, specs=(replace(PLAN.specs[0], args=("[" * 100 + '"\\"{',)), *PLAN.specs[1:])),
        "demo.yaml",
        str,
    )
    write_state(run_dir, record)
    assert read_state(run_dir) == record


@pytest.mark.parametrize("args", [("--api-key", "sekrit-key-1"), ("--api-key=sekrit-key-1",)])
def test_a_routers_key_is_kept_as_its_reference_never_its_value(tmp_path, args):
    router = replace(PLAN.specs[1], args=args)
    plan = replace(PLAN, specs=(PLAN.specs[0], router))
    sources = {"sekrit-key-1": "${env:K}", "--api-key=sekrit-key-1": "--api-key=${env:K}"}
    record = planned_record(plan, "demo.yaml", lambda s: s.replace("sekrit-key-1", "***"), sources=sources)
    assert record.role("router").api_key == "${env:K}" and record.role("prefill").api_key is None
    run_dir = RunDir(tmp_path / "demo")
    write_state(run_dir, record)
    assert "sekrit" not in run_dir.state_file.read_text()
    assert read_state(run_dir).role("router").api_key == "${env:K}"
