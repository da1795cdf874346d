"""What a new user meets when `up` cannot start: each refused at once, saying what to do, nothing left
behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import Deployment, free_ports, stand_in
from rehearsal import READY_AFTER, require_free

from muse_launch.core import load_plan

pytestmark = pytest.mark.integration
EPD = "topologies/epd-b300.yaml"


def test_only_a_role_whose_dependencies_are_not_up_is_refused_at_once(deployment: Deployment) -> None:
    """It used to say "assuming already up", wait the router's whole 600 s, then fail."""
    require_free(load_plan(EPD, rehearse=True).plan)
    started = time.monotonic()
    run = deployment.cli("up", EPD, "--rehearse", "--only", "router", "-d")
    took = time.monotonic() - started
    assert run.returncode == 1, run.stdout + run.stderr
    assert "error: --only router: nothing was started; what it needs is not up:" in run.stderr
    assert "prefill (http://127.0.0.1:30001): GET /health: connection refused" in run.stderr
    assert "fix: start those first (the same `up` with `--only decode`, `--only prefill`)" in run.stderr
    assert took < 30, f"{took:.1f}s: it waited for something"  # seconds on a loaded machine, not 600
    assert json.loads(deployment.cli("ls", "--json").stdout) == []  # no record left behind


def test_ports_held_by_another_deployment_name_it_and_how_to_stop_it(deployment: Deployment) -> None:
    require_free(load_plan(EPD, rehearse=True).plan)
    epd = Deployment(deployment.home, "epd-b300")
    up = epd.cli("up", EPD, "--rehearse", "-d", "--set", READY_AFTER, timeout=120)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        epd.status()  # the roles' sessions, for the scan of what is left
        prog = f"{Path(sys.executable).name} -m muse_launch"  # as this test ran it: copied as it is
        assert f"smoke it with `{prog} smoke epd-b300`, stop it with `{prog} down epd-b300`" in up.stdout
        assert complete(epd, "logs epd-b300 ") == ["encoder", "prefill", "decode", "router"]
        assert complete(epd, "logs epd-b300 de") == ["decode"]
        assert complete(epd, "logs pre") == ["prefill"]  # one deployment running: NAME may be left out
        assert complete(epd, "logs epd-b300 prefill ") == ["encoder", "decode", "router"]
        second = deployment.cli("up", EPD, "--rehearse", "-d", "--set", "name=second", "--set", READY_AFTER)
        assert second.returncode == 1, second.stdout + second.stderr
        assert "roles.router http port 8000 is in use by pid " in second.stderr
        assert "(role router of epd-b300, " in second.stderr  # its title wipes its marker: named all the same
        assert "(role prefill of epd-b300, " in second.stderr
        fix = "fix: another deployment holds them: stop it first with `muse-launch down epd-b300`"
        assert fix in second.stderr
        assert "start:" not in second.stdout + second.stderr  # how it starts: said once nothing refuses
        listed = json.loads(deployment.cli("ls", "--json").stdout)
        assert [(d["name"], d["state"], d["ready"], d["roles"]) for d in listed] == [
            ("epd-b300", "ready", 4, 4)
        ]
        status = json.loads(epd.cli("status", "--json").stdout)
        assert status["name"] == "epd-b300" and {r["health"] for r in status["roles"]} == {"ok"}
    finally:
        down = epd.cli("down", "epd-b300", timeout=120)
        epd.kill_leftovers()
    assert down.returncode == 0, down.stdout + down.stderr
    assert epd.alive() == []
    nothing = deployment.cli("status", "--json")
    assert nothing.returncode == 1 and json.loads(nothing.stdout)["error"] == "no deployment is running"
    assert json.loads(deployment.cli("ls", "--json").stdout) == []


def complete(d: Deployment, line: str) -> list[str]:
    """What bash's completion offers for `muse-launch LINE` (typer's own completion protocol)."""
    words = ["muse-launch", *line.split()] + ([""] if line.endswith(" ") else [])
    env = {
        **d.env,
        "_MUSE_LAUNCH_COMPLETE": "complete_bash",
        "COMP_WORDS": " ".join(words),
        "COMP_CWORD": str(len(words) - 1),
    }
    done = subprocess.run(
        [str(Path(sys.executable).with_name("muse-launch"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_an_address_that_is_not_this_machines_is_said_to_be_so(deployment: Deployment) -> None:
    """It used to read "in use by an unknown process"."""
    (port,) = free_ports(1)
    path = deployment.write({"server": stand_in(port)}, host="10.213.7.9")
    run = deployment.cli("up", path, "-d")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "not an address of this machine: 10.213.7.9 (server)" in run.stderr
    assert "unknown process" not in run.stderr
    assert "fix: run `up` on the machine that has it, submit it to SLURM with `up --on slurm`" in run.stderr
    assert json.loads(deployment.cli("ls", "--json").stdout) == []
