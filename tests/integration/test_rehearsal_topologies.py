"""Every file in topologies/ through the real CLI in rehearsal: `up --rehearse -d`, `status`, `smoke`
and `down`, with the simulated engines behind the real routers, and nothing left alive after.

The files use fixed ports, so they run one after another; a port held by anything else fails the
test before it starts, naming the holder. Multi-node files run with each node on its own loopback
address (127.0.0.1, 127.0.0.2, ...); without --rehearse, `up` refuses them.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from harness import REPO, Deployment
from rehearsal import (
    READY_AFTER,
    assert_nothing_left,
    recorded_processes,
    require_free,
    sim_roles,
    tails,
    tear_down,
)

from muse_launch.core import load_plan
from muse_launch.engines.argv import has_flag, last_value
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.proc.ports import busy_ports
from muse_launch.sim.config import parse_engine_args, startup_errors

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]

TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))
MULTI_NODE = [f for f in TOPOLOGIES if len({s.node for s in load_plan(f).plan.specs if s.node}) > 1]


def parsers_on(plan: Plan, flag: str) -> bool:
    return any(has_flag(s.args, flag) for s in plan.specs if s.kind in ("prefill", "decode", "worker"))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[f.stem for f in TOPOLOGIES])
def test_up_smoke_down(path: Path, tmp_path: Path):
    plan = load_plan(path, [READY_AFTER], rehearse=True).plan
    d = Deployment(tmp_path / "home", plan.name)
    d.home.mkdir()
    require_free(plan)
    processes = {}
    try:
        up = d.cli("up", path, "--rehearse", "-d", "--set", READY_AFTER, timeout=120)
        assert up.returncode == 0, f"up: {up.stdout}{up.stderr}\n{tails(d)}"
        if any(s.gpus for s in plan.specs):  # the host's GPUs are not read: a rehearsal needs none
            assert "GPU check skipped: a rehearsal runs no GPU engine" in up.stdout.splitlines(), up.stdout
        processes = recorded_processes(d)

        status = d.status()
        assert status["state"] == "ready", status
        assert [(r["name"], r["state"], r["health"]) for r in status["roles"]] == [
            (s.name, "ready", "ok") for s in plan.specs
        ], status

        smoke = d.cli("smoke", plan.name, "--timeout", "60", timeout=120)
        assert smoke.returncode == 0, f"smoke: {smoke.stdout}{smoke.stderr}\n{tails(d)}"
        assert "ok   chat" in smoke.stdout, smoke.stdout
        if parsers_on(plan, "--reasoning-parser"):
            assert "ok   reasoning" in smoke.stdout, smoke.stdout
        if parsers_on(plan, "--tool-call-parser"):
            assert "ok   tool call" in smoke.stdout, smoke.stdout
        for role in sim_roles(plan):  # each simulated engine kept its state in the run directory, not /tmp
            assert (d.run_dir / "sim" / role / "sim-models").is_dir(), role

        down = d.cli("down", plan.name, timeout=120)
        assert down.returncode == 0, f"down: {down.stdout}{down.stderr}"
        assert_nothing_left(d, plan, processes)
    except BaseException:
        tear_down(d, processes)
        raise


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[f.stem for f in TOPOLOGIES])
def test_the_sim_reads_every_rendered_argv(path: Path):
    """Each engine argv the file renders, as the simulated engine understands it: its role, its
    node rank and where the nodes meet, which of them serve HTTP, and no start-up error."""
    plan = load_plan(path, rehearse=True).plan
    for spec in plan.specs:
        if "muse_launch.sim" not in spec.launcher:
            continue
        cfg = parse_engine_args(spec.engine, list(spec.args))
        assert startup_errors(cfg) == [], spec.name
        # SGLang node ranks > 0 answer /health on their port (a dummy server) though the plan lists none.
        assert cfg.serves_http == ("http" in spec.ports or spec.engine == "sglang" and bool(spec.node)), (
            spec.name
        )
        if cfg.serves_http:
            assert cfg.host == spec.bind, spec.name
        ranks = [s.name for s in plan.specs if s.role == spec.role and s.node]
        if len(ranks) > 1:
            assert (cfg.node_rank, cfg.nnodes) == (ranks.index(spec.name), len(ranks)), spec.name
            head = plan.spec(ranks[0])
            assert cfg.dist_init == (head.bind, head.ports["dist_init"]), spec.name
        served = last_value(spec.args, "--served-model-name")
        assert cfg.served_model_name == (served or cfg.model), spec.name


@pytest.mark.parametrize("path", MULTI_NODE, ids=[f.stem for f in MULTI_NODE])
def test_multi_node_needs_rehearse_here(path: Path, tmp_path: Path):
    d = Deployment(tmp_path / "home", path.stem)
    up = d.cli("up", path, "-d")
    assert up.returncode == 2, up.stdout + up.stderr
    assert "spans 2 nodes" in up.stderr and "with --rehearse" in up.stderr, up.stderr
    assert not (d.run_dir / "state.json").exists()


def test_multi_node_rehearsal_plan_puts_each_node_on_its_own_loopback_address():
    plan = load_plan(REPO / "topologies" / "vllm-multinode-dep-b200.yaml", rehearse=True).plan
    assert [(s.name, s.bind, s.ports["http"]) for s in plan.specs] == [
        ("server@node0", "127.0.0.1", 8000),
        ("server@node1", "127.0.0.2", 8000),
    ]


def test_port_preflight_is_per_address():
    """The same port on two loopback addresses: only the role on the held address is reported busy."""
    with socket.create_server(("127.0.0.2", 0)) as held:
        port = held.getsockname()[1]
        plan = Plan(
            "two-nodes",
            (
                LaunchSpec(
                    "a@node0",
                    "a",
                    "worker",
                    "command",
                    ("serve",),
                    (),
                    bind="127.0.0.1",
                    ports={"http": port},
                ),
                LaunchSpec(
                    "a@node1",
                    "a",
                    "worker",
                    "command",
                    ("serve",),
                    (),
                    host="127.0.0.2",
                    bind="127.0.0.2",
                    ports={"http": port},
                ),
            ),
            (("a@node0", "a@node1"),),
        )
        [busy] = busy_ports(plan)
    assert busy.role == "a@node1" and busy.host == "127.0.0.2"
    assert str(busy).startswith(f"roles.a@node1 http port {port} on 127.0.0.2 is in use by pid "), str(busy)


def test_planned_ports_are_the_ones_the_cli_plans(tmp_path: Path):
    """The ports these tests check are the ones `plan --rehearse` prints (and `up --rehearse` binds)."""
    path = REPO / "topologies" / "helion-gb300.yaml"
    d = Deployment(tmp_path / "home", "helion-gb300")
    printed = json.loads(d.cli("plan", path, "--rehearse", "--format", "json").stdout)
    plan = load_plan(path, rehearse=True).plan
    assert [(r["name"], r["bind"], r["ports"]) for r in printed["roles"]] == [
        (s.name, s.bind, dict(s.ports)) for s in plan.specs
    ]
