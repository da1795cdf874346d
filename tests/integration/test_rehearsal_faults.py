"""Wiring broken on purpose: the rehearsal fails as it would on GPUs, with a message naming the roles.

(a) the router told the wrong KV bootstrap port; (b) a decode whose prefill's bootstrap is not where
it is told; (d) two routers on one metrics port. (c), a language worker given a wrong encoder URL, is
no engine failure: SGLang 0.5.23 reports healthy without its encoders (the simulated engine too, see
test_sim_rehearsal.py); `up` catches it by reading the worker's encoder list (issue 14, the runtime).

In a file, the checks of `validate` catch (a), (d) and the file's way of getting (c) wrong before
anything starts. The point here is the runtime: each broken plan is a good file's rehearsal plan with
one spec changed through the Python API (what no file gets past the checks), run by the runtime's own
`bring_up`, detached, in a subprocess exactly as `up -d` runs it; then `smoke`, `status` and `down`
are the real CLI. After each, nothing of the deployment is alive and its ports are closed.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from harness import REPO, Deployment, free_ports
from rehearsal import READY_AFTER, assert_nothing_left, recorded_processes, require_free, tails, tear_down

from muse_launch.core import load_plan
from muse_launch.plan.spec import Plan

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]

TOPOLOGIES = REPO / "topologies"
KV_TIMEOUT = "1"  # the sims' KV hand-off gives up after 1 s (3 s by default): a failing request costs ~5 s
UP_DETACHED = """
import pickle, sys
from rich.console import Console
from muse_launch.errors import UserError
from muse_launch.local.up import UpOptions, bring_up
plan, source = pickle.loads(open(sys.argv[1], "rb").read())
try:
    sys.exit(bring_up(plan, source, str, UpOptions(detach=True), Console(width=200)))
except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)
"""


def rehearsal(name: str, *sets: str) -> tuple[Plan, Path]:
    source = TOPOLOGIES / f"{name}.yaml"
    plan = load_plan(source, [READY_AFTER, *sets], rehearse=True).plan
    sims = [
        replace(s, launcher=(*s.launcher[:-1], "--kv-timeout", KV_TIMEOUT, "--"))
        if "muse_launch.sim" in s.launcher
        else s
        for s in plan.specs
    ]
    return replace(plan, specs=tuple(sims)), source


def change(plan: Plan, name: str, **changes) -> Plan:
    assert name in [s.name for s in plan.specs], name
    return replace(plan, specs=tuple(replace(s, **changes) if s.name == name else s for s in plan.specs))


def swap(args: Iterable[str], old: list[str], new: list[str]) -> tuple[str, ...]:
    """`args` with the one occurrence of the sequence `old` replaced by `new`."""
    args = list(args)
    at = [i for i in range(len(args)) if args[i : i + len(old)] == old]
    assert len(at) == 1, (old, args)
    return tuple(args[: at[0]] + new + args[at[0] + len(old) :])


class Rehearsals:
    """Broken plans brought up under one MUSE_LAUNCH_HOME; whatever they leave is found and killed."""

    def __init__(self, home: Path):
        self.home = home
        self.runs: list[
            tuple[Deployment, Plan, str]
        ] = []  # and `up`'s output, which names every pid it started
        self.processes: dict = {}

    def up(self, plan: Plan, source: Path) -> tuple[Deployment, subprocess.CompletedProcess]:
        require_free(plan)
        d = Deployment(self.home, plan.name)
        pickled = self.home.parent / f"{plan.name}.plan.pickle"
        pickled.write_bytes(pickle.dumps((plan, source)))
        result = subprocess.run(
            [sys.executable, "-c", UP_DETACHED, str(pickled)],
            env=d.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.runs.append((d, plan, result.stdout + result.stderr))
        if result.returncode == 0:
            self.processes.update(recorded_processes(d))
        return d, result

    def check_nothing_left(self) -> None:
        for d, plan, output in self.runs:
            assert_nothing_left(d, plan, self.processes)
            # A failed `up` stops what it started before returning: the pids its progress lines named.
            for pid in map(int, re.findall(r"\bstarting\s+pid (\d+)", output)):
                try:
                    proc = psutil.Process(pid)
                    ours = proc.status() != psutil.STATUS_ZOMBIE and re.search(
                        r"muse_launch\.sim|router", " ".join(proc.cmdline())
                    )
                except psutil.Error:
                    continue
                assert not ours, f"{plan.name}: pid {pid}, started by `up`, is still alive"

    def clean_up(self) -> None:
        for d, _, _ in self.runs:
            tear_down(d, self.processes)


@pytest.fixture
def rehearsals(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    r = Rehearsals(home)
    try:
        yield r
        r.check_nothing_left()
    finally:
        r.clean_up()


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


# ---- in a file, the checks see it first ------------------------------------------------------


@pytest.mark.parametrize(
    "sets, says",
    [
        (
            ["roles.router.args=[--prefill, 'http://127.0.0.1:30001', '8996']"],
            "router tells decode workers to fetch KV from prefill at bootstrap port 8996, but prefill binds "
            "8998",
        ),
        (["roles.prefill.encoders=[decode]"], "prefill.encoders lists decode, a decode role"),
        (
            [
                "roles.router2={kind: router, port: 8001, metrics_port: 29000, prefill: [prefill], decode: "
                "[decode]}"
            ],
            "router2 binds metrics port 29000, already the metrics port of router",
        ),
    ],
    ids=["router-bootstrap-port", "encoder-reference", "metrics-port"],
)
def test_the_checks_catch_it_in_a_file(sets, says, tmp_path):
    file = TOPOLOGIES / "epd-b300.yaml"
    sets = [x for s in sets for x in ("--set", s)]
    validate = cli("validate", file, *sets)
    assert validate.returncode == 1 and says in validate.stderr, validate.stdout + validate.stderr
    up = Deployment(tmp_path, "epd-b300").cli("up", file, "--rehearse", "-d", *sets)
    assert up.returncode == 1 and says in up.stderr, up.stdout + up.stderr
    assert not (tmp_path / "epd-b300").exists()  # refused before anything started


# ---- at runtime ------------------------------------------------------------------------------


def smoke_fails(d: Deployment) -> str:
    smoke = d.cli("smoke", d.name, "--timeout", "60", timeout=120)
    assert smoke.returncode == 1, f"{smoke.stdout}{smoke.stderr}\n{tails(d)}"
    return smoke.stdout


def down(d: Deployment) -> None:
    result = d.cli("down", d.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_router_told_the_wrong_bootstrap_port(rehearsals):
    """(a) up is fine (readiness never asks the bootstrap port); the first request fails at the decode."""
    (wrong,) = free_ports(1)
    plan, source = rehearsal("epd-b300")
    router = plan.spec("router")
    plan = change(
        plan,
        "router",
        args=swap(router.args, ["http://127.0.0.1:30001", "8998"], ["http://127.0.0.1:30001", str(wrong)]),
    )
    d, up = rehearsals.up(plan, source)
    assert up.returncode == 0, up.stdout + up.stderr
    assert d.status()["state"] == "ready"

    out = smoke_fails(d)
    assert re.search(
        rf"FAIL chat .*KV transfer failed for bootstrap_room \d+ \(bootstrap 127\.0\.0\.1:{wrong}\): "
        rf"decode 127\.0\.0\.1:30002 could not fetch the room: cannot connect to the prefill's KV "
        rf"bootstrap server at 127\.0\.0\.1:{wrong}: connection refused",
        out,
    ), out
    assert (
        f"where: 127.0.0.1:{wrong}: no role of epd-b300 listens there; it comes from router "
        f"(--prefill http://127.0.0.1:30001 {wrong})" in out
    ), out
    assert "where: 127.0.0.1:30002 is decode's http port" in out, out
    assert "reasoning" not in out and "tool call" not in out  # not tried once the chat itself failed
    down(d)


def test_decode_cannot_reach_its_prefills_bootstrap(rehearsals):
    """(b) Two nodes: the prefill on 127.0.0.1 moved its KV bootstrap port; router and the decode on
    127.0.0.2 still say 8998, so the decode finds nothing there."""
    (moved,) = free_ports(1)
    plan, source = rehearsal("helion-gb300")
    prefill = plan.spec("prefill@tray0")
    plan = change(
        plan,
        "prefill@tray0",
        ports={**prefill.ports, "bootstrap": moved},
        args=swap(
            prefill.args,
            ["--disaggregation-bootstrap-port", "8998"],
            ["--disaggregation-bootstrap-port", str(moved)],
        ),
    )
    d, up = rehearsals.up(plan, source)
    assert up.returncode == 0, up.stdout + up.stderr
    assert (
        f"listening: disaggregation bootstrap on 127.0.0.1:{moved}"
        in (d.run_dir / "logs" / "prefill@tray0.log").read_text()
    )

    out = smoke_fails(d)
    assert re.search(
        r"FAIL chat .*\(bootstrap 127\.0\.0\.1:8998\): decode 127\.0\.0\.2:30002 could not fetch the "
        r"room: cannot connect to the prefill's KV bootstrap server at 127\.0\.0\.1:8998",
        out,
    ), out
    assert (
        "where: 127.0.0.1:8998: no role of helion-gb300 listens there; it comes from router "
        "(--prefill http://127.0.0.1:30001 8998)" in out
    ), out
    assert "where: 127.0.0.2:30002 is decode@tray1's http port" in out, out
    assert "could not fetch the room" in (d.run_dir / "logs" / "decode@tray1.log").read_text()
    down(d)


def test_two_routers_on_one_metrics_port(rehearsals):
    """(d) router2 (started after router) finds the metrics port taken: it exits, `up` names it and the
    holder."""
    plan, source = rehearsal(
        "pd-b300-high-throughput",
        "roles.router2={kind: router, port: 8001, metrics_port: 29001, prefill: [prefill], decode: [decode]}",
    )
    second = plan.spec("router2")
    plan = change(
        plan,
        "router2",
        ports={**second.ports, "metrics": 29000},
        depends_on=(*second.depends_on, "router"),
        args=swap(second.args, ["--prometheus-port", "29001"], ["--prometheus-port", "29000"]),
    )
    plan = replace(plan, waves=(*(tuple(n for n in w if n != "router2") for w in plan.waves), ("router2",)))
    d, up = rehearsals.up(plan, source)
    out = up.stdout + up.stderr
    assert up.returncode == 1, out
    assert re.search(
        r"error: role router2 failed: exited with code 1 before it was ready; its metrics port 29000 "
        r"is in use by pid \d+ \(role router, ",
        out,
    ), out
    assert "router2 | " in out and "Address already in use" in out, out
    assert "everything started was stopped" in out, out


def test_language_worker_given_a_wrong_encoder_url(rehearsals):
    """(c) SGLang 0.5.23 reports the prefill healthy without its encoder; `up` waits for the prefill's
    encoder list to hold the encoder the file wires to it, and at the prefill's timeout fails naming
    both ends and the URL (issue 14)."""
    (nowhere,) = free_ports(1)
    plan, source = rehearsal("epd-b300")
    prefill = plan.spec("prefill")
    plan = change(
        plan,
        "prefill",
        probe=replace(prefill.probe, timeout=6.0),
        args=swap(
            prefill.args,
            ["--encoder-urls", "http://127.0.0.1:30010"],
            ["--encoder-urls", f"http://127.0.0.1:{nowhere}"],
        ),
    )
    d, up = rehearsals.up(plan, source)
    assert up.returncode == 1, up.stdout + up.stderr
    assert (
        "error: role prefill failed: not wired after 6s: its encoder list (GET "
        "http://127.0.0.1:8997/list_encoder_urls) does not hold encoder encoder at http://127.0.0.1:30010"
        in up.stdout
    ), up.stdout + up.stderr
    status = d.status()
    assert status["state"] == "stopped"
    assert {r["name"]: r["wiring"] for r in status["roles"]}["prefill"] == {"encoder": "0/1"}
