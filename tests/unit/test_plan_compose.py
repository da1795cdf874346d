"""The plan that runs is composed in one place (plan/compose.py): for each backend, what it composes from one
file equals what the paths it replaced composed (build, replicas, rehearsal, placement, start policy)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from muse_launch.plan.build import build_plan
from muse_launch.plan.compose import compose
from muse_launch.plan.placement import with_replicas
from muse_launch.plan.rehearse import rehearsal_plan
from muse_launch.plan.start_policy import OVERLAP, WAVES, choose
from muse_launch.slurm.placement import AllocatedNode, allocated_plan, on_nodes
from muse_launch.topology.load import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[2] / "topologies"
FILES = sorted(TOPOLOGIES.glob("*.yaml"))
VERSIONS = [{}, {"sglang": "0.5.23", "vllm": "0.11.0"}]


def _topology(path: Path):
    return load_topology(path, environ={}).topology


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
@pytest.mark.parametrize("rehearse", [False, True], ids=["real", "rehearsal"])
def test_this_hosts_plan_is_the_files_plan_rehearsed_and_started_by_its_policy(path, rehearse):
    topology = _topology(path)
    for versions in VERSIONS:
        plan = build_plan(topology)
        plan = rehearsal_plan(plan, topology, sys.executable) if rehearse else plan
        before = choose(plan, topology.start, versions)
        after = compose(topology, rehearse=rehearse, versions=versions)
        assert after.plan == before.plan and after.policy == before
    assert compose(topology, rehearse=rehearse).plan == (
        rehearsal_plan(build_plan(topology), topology, sys.executable) if rehearse else build_plan(topology)
    )


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_supervisor_placing_one_more_instance_composes_what_its_replan_did(path):
    topology = _topology(path)
    role = next((name for name, r in topology.roles.items() if not r.nodes), next(iter(topology.roles)))
    counts = {role: topology.roles[role].replicas + 1}
    changed = with_replicas(topology, counts, None)
    for rehearse in (False, True):
        plan = build_plan(changed)
        plan = rehearsal_plan(plan, changed, sys.executable) if rehearse else plan
        seen: list = []

        def read(p, seen=seen):
            seen.append(p)
            return {"sglang": "0.5.23"}

        composed = compose(topology, counts=counts, rehearse=rehearse, versions=read)
        assert seen == [plan]  # the versions are read from the plan before its policy, as replan read them
        assert composed.plan == choose(plan, topology.start, {"sglang": "0.5.23"}).plan


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
@pytest.mark.parametrize("rehearse", [False, True], ids=["real", "rehearsal"])
def test_slurm_composes_the_plan_moved_onto_its_nodes(path, rehearse):
    topology = _topology(path)
    nodes = [AllocatedNode(f"node{i}", f"10.0.0.{i + 1}") for i in range(16)]
    try:
        before = allocated_plan(build_plan(topology), topology, nodes, rehearse, sys.executable)
    except (ValueError, IndexError, KeyError) as exc:
        with pytest.raises(type(exc)):
            compose(topology, rehearse=rehearse, where=on_nodes(nodes))
        return
    assert compose(topology, rehearse=rehearse, where=on_nodes(nodes)).plan == before
    assert compose(topology, rehearse=rehearse, where=on_nodes(nodes)).policy is None  # SLURM starts in waves


def test_the_files_start_is_the_policy_asked():
    topology = _topology(TOPOLOGIES / "epd-b300.yaml")
    for start in (WAVES, OVERLAP):
        edited = topology.model_copy(update={"start": start})
        assert compose(edited, versions={}).policy == choose(build_plan(edited), start, {})
