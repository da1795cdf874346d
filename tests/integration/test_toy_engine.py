"""An engine added as the registry says (one module, one line in muse_launch/registry.py) plans with its own
facts and rehearses end to end: `up --rehearse -d`, `status`, `smoke`, `down`, nothing left alive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO, Deployment, free_ports

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]

# The one registry line, run before muse_launch reads the registry; then the CLI as usual.
CLI_WITH_TOY = """import sys
from muse_launch import registry
registry.WORKER_ENGINES["toyserve"] = "toy_engine"
from muse_launch.cli import main
main(sys.argv[1:])
"""


def toy_cli(d: Deployment, *args: object, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**d.env, "PYTHONPATH": str(REPO / "tests" / "stand_ins")}
    return subprocess.run(
        [sys.executable, "-c", CLI_WITH_TOY, *map(str, args)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def toy_topology(d: Deployment) -> Path:
    prefill, decode, router, metrics = free_ports(4)
    return d.write(
        {
            "prefill": {"kind": "prefill", "port": prefill},
            "decode": {"kind": "decode", "port": decode},
            "router": {
                "kind": "router",
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode"],
            },
        },
        model="toy/model",
        engine="toyserve",
        rehearse={"ready_after": 0.2},
    )


def test_a_registered_engine_plans_with_its_own_facts(tmp_path: Path):
    d = Deployment(tmp_path / "home", "toy-plan")
    d.home.mkdir()
    path = toy_topology(d)
    plan = toy_cli(d, "plan", path, "--format", "json")
    assert plan.returncode == 0, plan.stderr
    specs = {s["name"]: s for s in json.loads(plan.stdout)["roles"]}
    assert specs["prefill"]["engine"] == "toyserve"
    assert specs["prefill"]["argv"][0] == "toyserve"  # its own program
    assert specs["prefill"]["ports"]["bootstrap"] == 9100  # its own default bootstrap port
    assert "9100" in specs["router"]["argv"]  # and the router is told that port
    docker = toy_cli(d, "plan", path, "--format", "docker")
    assert "# no image ships toyserve: run it on the host" in docker.stdout, docker.stdout
    # Without the registry line the schema does not know it.
    unknown = d.cli("validate", path)
    assert unknown.returncode == 2 and "toyserve" in unknown.stderr, unknown.stderr


def test_a_registered_engine_rehearses_up_smoke_down(tmp_path: Path):
    d = Deployment(tmp_path / "home", "toy-rehearsal")
    d.home.mkdir()
    path = toy_topology(d)
    try:
        up = toy_cli(d, "up", path, "--rehearse", "-d")
        assert up.returncode == 0, up.stdout + up.stderr
        status = json.loads(toy_cli(d, "status", d.name, "--json").stdout)
        assert sorted((r["name"], r["state"], r["health"]) for r in status["roles"]) == [
            ("decode", "ready", "ok"),
            ("prefill", "ready", "ok"),
            ("router", "ready", "ok"),
        ], status
        argv = next(r["argv"] for r in d.state_file()["roles"] if r["name"] == "prefill")
        assert argv[argv.index("--engine") + 1] == "sglang"  # the simulated SGLang plays the fork...
        assert argv[argv.index("--disaggregation-bootstrap-port") + 1] == "9100"  # ...at the fork's own port
        smoke = toy_cli(d, "smoke", d.name, "--timeout", "60")
        assert smoke.returncode == 0 and "ok   chat" in smoke.stdout, smoke.stdout + smoke.stderr
        down = toy_cli(d, "down", d.name)
        assert down.returncode == 0, down.stdout + down.stderr
        assert d.alive() == []
    finally:
        toy_cli(d, "down", d.name)
