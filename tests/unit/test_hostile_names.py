"""Hostile input, second round (docs/security.md): nothing from a file runs as a command, names never
become paths outside the run directory, generated names never collide, YAML 1.1 never converts silently."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cli_run import muse

from muse_launch.plan.build import PlanError, build_plan
from muse_launch.proc import cgroups
from muse_launch.rundir.state import RunDir
from muse_launch.sim.config import ArgvError
from muse_launch.topology.grammar import UnsafeName
from muse_launch.topology.model import Topology

SHELL_FORMATS = ("shell", "docker", "sbatch")


def base(**roles_extra) -> dict:
    return {
        "version": 1,
        "name": "hostile",
        "hardware": "cpu",
        "host": "10.0.0.1",
        "nodes": {"n0": {"address": "10.0.0.1"}, "n1": {"address": "10.0.0.2"}},
        "roles": {
            "app": {
                "kind": "command",
                "command": ["sleep", "1000"],
                "port": 30000,
                "ready": {"http": "/health"},
                **roles_extra,
            }
        },
    }


def write(tmp_path: Path, data: dict | str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def cli(tmp_path: Path, *args) -> object:
    return muse(*args, env={**os.environ, "MUSE_LAUNCH_HOME": str(tmp_path / "home")}, cwd=tmp_path)


def line_of(path: Path, needle: str) -> int:
    text = path.read_text()
    return text.count("\n", 0, text.index(needle)) + 1


def key_line(path: Path, *keys: str) -> int:
    """The line of the key at `keys`, read with PyYAML's own nodes."""
    node = yaml.compose(path.read_text())
    line = 1
    for key in keys:
        key_node, node = next((k, v) for k, v in node.value if k.value == key)
        line = key_node.start_mark.line + 1
    return line


def _with_host(data: dict, value: str) -> dict:
    data["host"] = value
    return data


def _node_named(data: dict, name: str) -> dict:
    data["nodes"][name] = data["nodes"].pop("n1")
    data["roles"]["app"]["nodes"] = [name]
    return data


def _node_address(data: dict, address: str) -> dict:
    data["nodes"]["n1"]["address"] = address
    data["roles"]["app"]["nodes"] = ["n1"]
    return data


def _role_named(data: dict, name: str) -> dict:
    data["roles"][name] = data["roles"].pop("app")
    return data


HOSTILE_FILES = {
    "env-key-substitution": (
        lambda d: (d["roles"]["app"].setdefault("env", {}).update({"A$(touch F)": "x"}), d)[1],
        ("roles", "app", "env", "A$(touch F)"),
        "roles.app.env.'A$(touch F)'",
        "environment name",
    ),
    "env-key-semicolons": (
        lambda d: (d.setdefault("env", {}).update({"B;touch F;C": "y"}), d)[1],
        ("env", "B;touch F;C"),
        "env.'B;touch F;C'",
        "environment name",
    ),
    "host-newline": (
        lambda d: _with_host(d, "10.0.0.1\ntouch F"),
        ("host",),
        "host",
        "not an IP address or a host name",
    ),
    "node-name-newline": (
        lambda d: _node_named(d, "n1\ntouch F"),
        ("nodes", "n1\ntouch F"),
        "nodes.'n1\\ntouch F'",
        "node name",
    ),
    "node-address-newline": (
        lambda d: _node_address(d, "10.0.0.2\ntouch F #"),
        ("nodes", "n1", "address"),
        "nodes.n1.address",
        "not an IP address or a host name",
    ),
    "role-key-trailing-newline": (
        lambda d: _role_named(d, "app\n"),
        ("roles", "app\n"),
        "roles.'app\\n'",
        "role name",
    ),
    "deployment-name-newline": (
        lambda d: (d.update(name="x\ntouch F"), d)[1],
        ("name",),
        "name",
        "deployment name",
    ),
    "role-bind-command": (
        lambda d: (d["roles"]["app"].update(bind="$(touch F)"), d)[1],
        ("roles", "app", "bind"),
        "roles.app.bind",
        "not an IP address or a host name",
    ),
}


@pytest.mark.faults("18.1 values that would run as commands in plan --format shell|docker|sbatch: refused")
@pytest.mark.parametrize("case", HOSTILE_FILES, ids=list(HOSTILE_FILES))
def test_a_value_that_would_run_in_a_script_is_refused(tmp_path: Path, case: str) -> None:
    change, keys, key, says = HOSTILE_FILES[case]
    path = write(tmp_path, change(base()))
    for fmt in SHELL_FORMATS:
        result = cli(tmp_path, "plan", path, "--format", fmt)
        assert result.returncode == 2, (fmt, result.stdout, result.stderr)
        assert result.stdout == "", result.stdout  # nothing rendered
        assert f"{path}:{key_line(path, *keys)}: {key}: " in result.stderr, result.stderr
        assert says in result.stderr and "\n  fix: " in result.stderr, result.stderr
    assert not (tmp_path / "F").exists()


@pytest.mark.faults("18.2 names that climb out of the run directory or the cgroup tree")
@pytest.mark.parametrize("name", ["../../../../../x", "..", "a/b", "x\n"])
def test_a_node_name_that_is_a_path_is_refused(tmp_path: Path, name: str) -> None:
    path = write(tmp_path, _node_named(base(), name))
    result = cli(tmp_path, "validate", path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:{key_line(path, 'nodes', name)}: nodes." in result.stderr and "node name" in result.stderr
    assert "fix: rename the node" in result.stderr, result.stderr


@pytest.mark.faults("18.2 names that climb out of the run directory or the cgroup tree")
@pytest.mark.parametrize("name", ["../x", "..", ".", "a/b", "", "x\0y"])
def test_paths_built_from_names_stay_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The second line of defence, where names become paths: one directory entry or refused."""
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    run_dir = RunDir(tmp_path / "home" / "d")
    with pytest.raises(UnsafeName):
        run_dir.log(name)
    with pytest.raises(UnsafeName):
        RunDir.of(name)
    monkeypatch.setattr(cgroups, "deployment_dir", lambda deployment, run_dir: tmp_path / "cg" / "d")
    with pytest.raises(UnsafeName):
        cgroups.create_role_cgroup("d", str(run_dir.path), name)
    assert not (tmp_path / "cg").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.faults("18.3 generated names that collide (replicas, nodes, containers)")
@pytest.mark.parametrize(
    "second, other, name",
    [
        ({"w": {"replicas": 2}, "w-1": {}}, "w", "w-1"),
        ({"w": {"nodes": ["n1"]}, "w-n1": {}}, "w", "w-n1"),
        ({"w-0": {}, "w": {"replicas": 3}}, "w-0", "w-0"),
    ],
)
def test_roles_whose_generated_names_meet_are_refused(
    tmp_path: Path, second: dict, other: str, name: str
) -> None:
    data = base()
    data["roles"] = {}
    for i, (role, extra) in enumerate(second.items()):
        data["roles"][role] = {
            "kind": "command",
            "command": ["sleep", "1000"],
            "port": 31000 + 10 * i,
            **extra,
        }
    path = write(tmp_path, data)
    result = cli(tmp_path, "validate", path)
    assert result.returncode == 2, result.stdout + result.stderr
    later, earlier = list(second)[1], list(second)[0]
    assert (
        f"{path}:{line_of(path, f'  {later}:')}: roles.{later}: the name {name!r} is also one of "
        f"roles.{earlier}'s" in result.stderr
    ), result.stderr
    assert f"fix: rename roles.{later} or roles.{earlier}" in result.stderr


def test_build_plan_never_lets_one_instance_replace_another() -> None:
    """A topology made in Python, past the loader: the plan refuses it instead of dropping one."""
    data = base()
    data["roles"] = {
        "w": {"kind": "command", "command": ["a"], "port": 31000, "replicas": 2},
        "w-1": {"kind": "command", "command": ["b"], "port": 32000},
    }
    with pytest.raises(PlanError, match="'w-1' is also w's"):
        build_plan(Topology.model_validate(data))


YAML11 = """version: 1
name: yaml11
hardware: cpu
roles:
  app:
    kind: command
    command: [sleep, 1000, on, 0755, 1.10, 12:30, 0x10, NO, 2024-01-01, 1_000, .inf]
    port: 30000
    restart: {policy: no}
    env: {A: on, B: 0755, C: 1.10, D: 12:30, E: 0x10, F: yes, G: 2024-01-01, on: off}
"""


@pytest.mark.faults("18.8 YAML 1.1 conversions: text kept as written, numbers never from booleans")
def test_yaml_11_text_is_kept_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, YAML11)
    assert cli(tmp_path, "validate", "--strict", path).returncode == 0
    ran = cli(tmp_path, "plan", path, "--format", "json", "--set", "roles.app.env.H=off")
    spec = json.loads(ran.stdout)["roles"][0]
    assert spec["argv"] == [
        "sleep",
        "1000",
        "on",
        "0755",
        "1.10",
        "12:30",
        "0x10",
        "NO",
        "2024-01-01",
        "1_000",
        ".inf",
    ]
    assert spec["env"] == {
        "A": "on",
        "B": "0755",
        "C": "1.10",
        "D": "12:30",
        "E": "0x10",
        "F": "yes",
        "G": "2024-01-01",
        "on": "off",
        "H": "off",
    }
    assert spec["restart"]["policy"] == "no"
    again = cli(
        tmp_path, "plan", path, "--format", "json", "--set", "roles.app.command=[sleep, yes, 0o17, 1e3]"
    )
    assert json.loads(again.stdout)["roles"][0]["argv"] == ["sleep", "yes", "0o17", "1e3"]


@pytest.mark.faults("18.8 YAML 1.1 conversions: text kept as written, numbers never from booleans")
@pytest.mark.parametrize(
    "old, new, key, says",
    [
        ("port: 30000", "port: true", "roles.app.port", "'true' is a boolean"),
        ("port: 30000", "port: 0x7530", "roles.app.port", "YAML 1.1 reads '0x7530' as 30000"),
        ("port: 30000", "port: 0755", "roles.app.port", "YAML 1.1 reads '0755' as 493"),
        ("port: 30000", "port: 500:00", "roles.app.port", "YAML 1.1 reads '500:00' as 30000"),
        ("port: 30000", "port: 30000\n    replicas: on", "roles.app.replicas", "'on' is a boolean"),
        ("port: 30000", "port: 30000\n    stop: {grace: yes}", "roles.app.stop.grace", "'yes' is a boolean"),
        (
            "port: 30000",
            "port: 30000\n    ready: {tcp: 1}",
            "roles.app.ready.tcp",
            "'1' is a number, not true or false",
        ),
        ("version: 1", "version: true", "version", "'true' is a boolean"),
        ("D: 12:30,", "D: ~,", "roles.app.env.D", "'~' is null in YAML"),
    ],
)
def test_yaml_11_never_makes_a_number(tmp_path: Path, old: str, new: str, key: str, says: str) -> None:
    path = write(tmp_path, YAML11.replace(old, new))
    result = cli(tmp_path, "validate", path)
    assert result.returncode == 2, result.stdout + result.stderr
    needle = new.split("\n")[-1].strip().split(":")[0] + ":"
    assert f"{path}:{line_of(path, needle)}: {key}: " in result.stderr, result.stderr
    assert says in result.stderr and "\n  fix: " in result.stderr, result.stderr


def test_a_set_value_is_held_to_the_same_rule(tmp_path: Path) -> None:
    path = write(tmp_path, YAML11)
    result = cli(tmp_path, "validate", path, "--set", "roles.app.port=yes")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--set roles.app.port: 'yes' is a boolean" in result.stderr, result.stderr


@pytest.mark.faults("18.2 names that climb out of the run directory or the cgroup tree")
@pytest.mark.parametrize("role", ["../x", "..", "a/b", "x\n"])
def test_the_simulated_engine_keeps_its_state_in_the_run_directory(tmp_path: Path, role: str) -> None:
    from muse_launch.sim.cli import default_state_dir

    environ = {"MUSE_LAUNCH_RUN_DIR": str(tmp_path / "run"), "MUSE_LAUNCH_ROLE": role}
    with pytest.raises(ArgvError, match="cannot name a directory under the run directory"):
        default_state_dir(environ)
    assert default_state_dir({**environ, "MUSE_LAUNCH_ROLE": "w@n1"}) == str(
        tmp_path / "run" / "sim" / "w@n1"
    )


@pytest.mark.faults("18.2 names that climb out of the run directory or the cgroup tree")
def test_a_state_naming_another_directory_is_damaged_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state.json read back names its deployment `../x`: `ls` lists the others and reports it damaged."""
    from muse_launch.plan.spec import LaunchSpec, Plan
    from muse_launch.rundir.state import deployments, write_state
    from muse_launch.supervise.planned_record import planned_record

    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    plan = Plan(
        "good",
        (LaunchSpec(name="app", role="app", kind="command", engine="command", launcher=("a",), args=()),),
        (("app",),),
    )
    write_state(RunDir.of("good"), planned_record(plan, "good.yaml", str))
    write_state(RunDir.of("bad"), planned_record(replace(plan, name="../x"), "bad.yaml", str))
    damaged: list = []
    assert [r.name for r in deployments(damaged)] == ["good"]
    assert [d.run_dir.name for d in damaged] == ["bad"] and "'../x', not 'bad'" in str(damaged[0])
    result = cli(tmp_path, "ls")
    assert result.returncode == 0 and "state damaged" in result.stdout, result.stdout + result.stderr
    assert "names deployment '../x', not 'bad'" in result.stderr


def test_a_file_written_in_the_home_is_no_deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file beside the run directories (a sweep's `--pick "$MUSE_LAUNCH_HOME/x.yaml"`) is neither listed
    nor reported damaged; a directory without a state is not listed either."""
    from muse_launch.rundir.state import deployments

    home = tmp_path / "home"
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(home))
    home.mkdir()
    (home / "picked.yaml").write_text("name: x\n")
    (home / "sweep-out").mkdir()
    damaged: list = []
    assert deployments(damaged) == [] and damaged == []
