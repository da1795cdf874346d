"""Hostile input, second round (docs/security.md): nothing from a file runs as a command, names never
become paths outside the run directory, generated names never collide, YAML 1.1 never converts silently."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cli_run import muse

from muse_launch.plan.build import build_plan
from muse_launch.render_text import comment, plan_docker, plan_shell
from muse_launch.rundir.state import RunDir
from muse_launch.slurm.files import SlurmFiles
from muse_launch.slurm.script import render_script
from muse_launch.topology.load import parse_topology

pytestmark = pytest.mark.integration  # starts processes

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


def _run_stubbed(tmp_path: Path, script: str) -> None:
    """`script` through `bash -n`, then run with no program reachable but the payload `touch`."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    (stubs / "touch").write_text(f"#!/bin/sh\n: > {tmp_path}/RAN\n")
    (stubs / "touch").chmod(0o755)
    (tmp_path / "shim.sh").write_text("command_not_found_handle() { return 0; }\n")
    path = tmp_path / "script.sh"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0, script
    subprocess.run(
        ["/bin/bash", str(path)],
        env={"PATH": str(stubs), "BASH_ENV": str(tmp_path / "shim.sh")},
        cwd=tmp_path,
        capture_output=True,
        timeout=30,
    )
    assert not (tmp_path / "RAN").exists(), f"the payload ran:\n{script}"


@pytest.mark.faults("18.1 values that would run as commands in plan --format shell|docker|sbatch: refused")
def test_the_renderers_quote_what_the_loader_would_refuse(tmp_path: Path) -> None:
    """The second line: a plan changed past the loader (hosts, nodes, names with newlines and `$(...)`),
    rendered as shell, docker and sbatch, runs no payload; every comment stays one line."""
    data = base(nodes=["n0", "n1"])
    data["roles"]["app"].pop("ready")
    topology = parse_topology(yaml.safe_dump(data), Path("t.yaml")).topology
    plan = build_plan(topology)
    evil = "x\ntouch F\n$(touch F)`touch F`"
    specs = tuple(
        replace(
            s,
            name=s.name + evil,
            host=s.host + evil,
            node=(s.node or "") + evil,
            env={**s.env, "V": evil},
            args=(*s.args, evil),
        )
        for s in plan.specs
    )
    plan = replace(plan, specs=specs, waves=(tuple(s.name for s in specs),))
    redact = lambda s: s  # noqa: E731
    for text in (plan_shell(plan, redact, topology), plan_docker(plan, redact, topology)):
        _run_stubbed(tmp_path, text)
    assert "\n" not in comment("a\nb\rc\x00d\u2028e") and comment("a\nb").startswith("# ")
    files = SlurmFiles(RunDir(tmp_path / "home" / "hostile"))
    files.dir.mkdir(parents=True)
    files.done.touch()  # the supervisor finished: the script ends instead of waiting for `down`
    _run_stubbed(tmp_path, render_script(topology, files, "/bin/true", False, []))


def test_a_hostile_value_where_any_text_is_fine_renders_quoted(tmp_path: Path) -> None:
    """Env values and args may hold anything a process can receive: kept, and quoted in every script."""
    evil = "it's $(touch F)\n`touch F`; touch F"
    data = base(env={"V": evil})
    data["roles"]["app"]["command"] = ["sleep", evil]
    path = write(tmp_path, data)
    for fmt in SHELL_FORMATS:
        result = cli(tmp_path, "plan", path, "--format", fmt)
        assert result.returncode == 0, result.stderr
        _run_stubbed(tmp_path, result.stdout)
    plan = json.loads(cli(tmp_path, "plan", path, "--format", "json").stdout)
    assert plan["roles"][0]["env"]["V"] == evil and plan["roles"][0]["argv"][-1] == evil
