"""`up --rehearse`: the same plan with every GPU engine replaced by the simulated engine.

Ports, wiring, order and the real router stay; every server binds loopback, and each node of a
multi-node topology becomes its own loopback address (127.0.0.1, 127.0.0.2, ...).
"""

from __future__ import annotations

from dataclasses import replace

from ..topology.model import NodeConfig, Topology
from .build import build_plan
from .spec import Plan

SIMULATED_ENGINES = ("sglang", "vllm")
DEFAULT_READY_AFTER = {"encoder": 1.0, "prefill": 2.0, "decode": 2.0, "worker": 2.0}


def rehearsal_topology(topology: Topology) -> Topology:
    nodes = {name: NodeConfig(address=f"127.0.0.{i + 1}") for i, name in enumerate(topology.nodes)}
    roles = {name: role.model_copy(update={"bind": None, "host": None}) for name, role in topology.roles.items()}
    return topology.model_copy(update={"host": "127.0.0.1", "bind": None, "nodes": nodes, "roles": roles})


def rehearsal_plan(topology: Topology, python: str) -> Plan:
    """`python` runs `-m muse_launch.sim`; passed in so that planning stays pure."""
    return simulated(build_plan(rehearsal_topology(topology)), python)


def simulated(plan: Plan, python: str) -> Plan:
    """The plan with its GPU engines replaced by the simulated engine (`up --on slurm --rehearse`
    plans with the allocation's addresses, then simulates)."""
    specs = []
    for spec in plan.specs:
        if spec.engine in SIMULATED_ENGINES:
            delay = spec.ready_after if spec.ready_after is not None else DEFAULT_READY_AFTER.get(spec.kind, 1.0)
            launcher = (python, "-m", "muse_launch.sim", "--engine", spec.engine, "--ready-after", f"{delay:g}", "--")
            spec = replace(spec, launcher=launcher)
        elif spec.kind == "router":
            # Keep the real router offline: it may try to fetch a tokenizer for the model a worker reports.
            spec = replace(spec, env={**spec.env, "HF_HUB_OFFLINE": "1"})
        specs.append(spec)
    return replace(plan, specs=tuple(specs))
