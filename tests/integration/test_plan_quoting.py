"""build_plan and the `plan` formats: waves, replicas, nodes, launchers, devices, vLLM wiring."""

from __future__ import annotations

import json
import shlex
import subprocess
import textwrap
from pathlib import Path

import pytest
from cli_run import Ran, muse

from muse_launch.plan.build import build_plan
from muse_launch.topology.load import load_topology

pytestmark = pytest.mark.integration  # starts processes


def cli(*args: str) -> Ran:
    return muse(*args)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def shell_blocks(text: str) -> dict[str, str]:
    """`plan --format shell`: each `# wave N: NAME (...)` comment and the command under it."""
    out = {}
    for block in text.split("\n\n"):
        first, _, command = block.partition("\n")
        if first.startswith("# wave "):
            out[first.split(": ", 1)[1].split(" ", 1)[0]] = command
    return out


def shell_words(command: str) -> list[str]:
    """What a POSIX shell reads: backslash-newline continues the line (shlex alone keeps the newline)."""
    return shlex.split(command.replace("\\\n", ""))


ODD_ARGS = [
    "--chat-template",
    "a template with spaces",
    "--json",
    '{"a": "b c", "d": [1, 2]}',
    "--quote",
    'it\'s "quoted"',
    "--dollar",
    "$HOME `id` $(id) \\n",
    "--glob",
    "*.py",
]


def test_plan_shell_quoting_round_trips(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        version: 1
        name: quoting
        hardware: b300
        model: M
        env: {{GREETING: "hello 'world' $USER"}}
        roles:
          worker:
            kind: worker
            gpus: [0]
            port: 30000
            args: {json.dumps(ODD_ARGS)}
    """,
    )
    run = cli("plan", str(path), "--format", "shell")
    assert run.returncode == 0, run.stderr
    command = shell_blocks(run.stdout)["worker"]
    plan = build_plan(load_topology(path, environ={}).topology)
    spec = plan.spec("worker")
    expected = [f"{k}={v}" for k, v in spec.env.items()] + list(spec.argv)
    assert shell_words(command) == expected
    echoed = subprocess.run(
        ["bash", "-c", "printf '%s\\n' " + command],
        capture_output=True,
        text=True,
        env={"USER": "someone", "HOME": "/home/x", "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
    )
    assert echoed.returncode == 0, echoed.stderr
    assert echoed.stdout.splitlines() == [line for word in expected for line in word.split("\n")]
