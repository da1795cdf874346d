"""`up --rehearse`: a transformation of the checked Plan, with every GPU engine replaced by the
simulated engine.

Ports, wiring, order and the real router stay. Each machine of the plan becomes a loopback address
of its own (this host and the first node 127.0.0.1, the next 127.0.0.2, ...), every server binds
that address, and every URL or address in an argv or env moves with it. The caller checks the
transformed plan's addresses and ports again (checks.recheck_placement).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from ..addresses import is_loopback, is_wildcard
from ..engines import ROUTER_ENGINES, WORKERS
from ..topology.model import Topology
from .spec import LaunchSpec, Plan

DEFAULT_READY_AFTER = {"encoder": 1.0, "prefill": 2.0, "decode": 2.0, "worker": 2.0}
SIMULATED = "muse_launch.sim"  # the module a rehearsed engine role runs
# An address as a whole argument: `10.0.0.1`, `10.0.0.1:20000`, `http://10.0.0.1:30001/path`.
_ADDRESS = re.compile(r"^(?P<scheme>[a-z]+://)?(?P<host>\[[^\]]+\]|[^:/\s]+)(?P<rest>(:\d+)?(/\S*)?)$")


def loopback_addresses(plan: Plan, topology: Topology) -> dict[str, str]:
    """Each machine's loopback stand-in, by the address the plan names it with (nodes first, in file
    order)."""
    machines: dict[str, str] = {}
    out: dict[str, str] = {}
    for address in [n.address for n in topology.nodes.values()] + [s.host for s in plan.specs]:
        machine = "this host" if is_loopback(address) or is_wildcard(address) else address
        machines.setdefault(machine, f"127.0.0.{len(machines) + 1}")
        out[address] = machines[machine]
    return out


def relocate(text: str, addresses: Mapping[str, str]) -> str:
    """`text` with the host moved, when it is an address, host:port or URL naming one of `addresses`."""
    m = _ADDRESS.match(text)
    if not m or m["host"] not in addresses:
        return text
    return f"{m['scheme'] or ''}{addresses[m['host']]}{m['rest']}"


def _relocated(spec: LaunchSpec, addresses: Mapping[str, str]) -> LaunchSpec:
    here = addresses[spec.host]
    own = {**addresses, spec.bind: here}  # a wildcard bind (`--host 0.0.0.0`) becomes this machine's address
    return replace(
        spec,
        host=here,
        bind=here,
        args=tuple(relocate(a, own) for a in spec.args),
        env={k: relocate(v, own) for k, v in spec.env.items()},
    )


# The `rehearse:` timing keys as the simulated engine's flags (muse_launch/sim/cli.py), and their scale to its
# units.
SIM_RATE_FLAGS = {
    "prefill_tokens_per_s": ("--prefill-tokens-per-s", 1.0),
    "itl_ms": ("--itl", 0.001),
    "itl_ms_per_running": ("--itl-per-running", 0.001),
    "max_running": ("--max-running", 1),
}


def sim_rate_args(rates: Mapping[str, float]) -> tuple[str, ...]:
    out: list[str] = []
    for key, (flag, scale) in SIM_RATE_FLAGS.items():
        if key in rates:
            value = rates[key] * scale
            out += [flag, str(int(value)) if key == "max_running" else f"{value:g}"]
    return tuple(out)


def rehearsal_plan(plan: Plan, topology: Topology, python: str) -> Plan:
    """`python` runs `-m muse_launch.sim`; passed in so that planning stays pure."""
    addresses = loopback_addresses(plan, topology)
    return simulated(replace(plan, specs=tuple(_relocated(s, addresses) for s in plan.specs)), python)


def simulated(plan: Plan, python: str) -> Plan:
    """Every GPU engine as the simulated engine, with the same arguments; the router kept offline. Addresses
    stay
    as they are (a rehearsal on Kubernetes keeps the cluster's DNS names)."""
    specs = []
    for spec in plan.specs:
        if spec.engine in WORKERS:
            delay = (
                spec.ready_after if spec.ready_after is not None else DEFAULT_READY_AFTER.get(spec.kind, 1.0)
            )
            launcher = (
                python,
                "-m",
                SIMULATED,
                "--engine",
                WORKERS[spec.engine].rehearsed_as,
                "--ready-after",
                f"{delay:g}",
                *sim_rate_args(spec.sim_rates),
                "--",
            )
            spec = replace(spec, launcher=launcher)
        elif spec.engine in ROUTER_ENGINES:
            # Keep the real router offline: it may try to fetch a tokenizer for the model a worker reports.
            spec = replace(spec, env={**spec.env, "HF_HUB_OFFLINE": "1"})
        specs.append(spec)
    return replace(plan, specs=tuple(specs))


def simulated_version(engine: str, argv: tuple[str, ...]) -> str | None:
    """The release the simulated engine plays, when `argv` runs it (a rehearsal); else None."""
    if SIMULATED not in argv[:4]:
        return None
    from ..sim.config import SGLANG_VERSION, VLLM_VERSION

    facts = WORKERS.get(engine)
    return {"sglang": SGLANG_VERSION, "vllm": VLLM_VERSION}.get(facts.rehearsed_as) if facts else None
