"""Plan-level rules of SPEC section 3. Each reads the plan `up` would run."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator

from .checks import CheckContext, Finding, error, plan_check

PORT_KEYS = {"http": "port", "bootstrap": "bootstrap_port", "encoder_bootstrap": "encoder_bootstrap_port",
             "metrics": "metrics_port", "side_channel": "side_channel_port", "dist_init": "dist_init_port"}
PORT_NAMES = {"http": "HTTP", "bootstrap": "KV bootstrap", "encoder_bootstrap": "encoder bootstrap",
              "metrics": "metrics", "side_channel": "side-channel", "dist_init": "dist-init"}


def _host_key(spec) -> str:
    return spec.node or spec.host


@plan_check
def duplicate_ports(ctx: CheckContext) -> Iterator[Finding]:
    """Two servers on one host binding one port: count only ports a server really binds."""
    seen: dict[tuple[str, int], tuple[str, str]] = {}
    for spec in ctx.plan.specs:
        for kind, port in spec.ports.items():
            key = (_host_key(spec), port)
            if key in seen:
                other, other_kind = seen[key]
                yield error(("roles", spec.role, PORT_KEYS.get(kind, "port")),
                            f"{spec.name} binds {PORT_NAMES.get(kind, kind)} port {port}, already the "
                            f"{PORT_NAMES.get(other_kind, other_kind)} port of {other} on this host",
                            f"give {spec.role} another {PORT_KEYS.get(kind, 'port')}", spec.name, other)
            else:
                seen[key] = (spec.name, kind)


@plan_check
def shared_gpus(ctx: CheckContext) -> Iterator[Finding]:
    """GPUs shared by roles need a memory budget that fits (the cookbook's encoder + prefill at 0.8)."""
    users: dict[tuple[str, int], list] = defaultdict(list)
    for spec in ctx.plan.specs:
        for gpu in spec.gpus:
            users[(_host_key(spec), gpu)].append(spec)
    reported: set[tuple[str, ...]] = set()
    for (_, gpu), specs in sorted(users.items(), key=lambda kv: kv[0][1]):
        if len(specs) < 2:
            continue
        names = tuple(s.name for s in specs)
        if names in reported:
            continue
        roles = {s.role: ctx.topology.roles[s.role] for s in specs}
        declared = {n: r.mem_fraction for n, r in roles.items() if r.mem_fraction is not None}
        undeclared = [n for n in roles if n not in declared]
        total = sum(declared.values())
        last = specs[-1]
        if len(undeclared) > 1:
            reported.add(names)
            yield error(("roles", last.role, "gpus"),
                        f"GPU {gpu} is shared by {', '.join(names)} and only one of them may go without a "
                        f"memory budget", f"set mem_fraction on {' or '.join(undeclared[:-1])} (e.g. 0.8), "
                        f"or give {last.role} other GPUs", *names)
        elif total > 1.0 or (undeclared and total >= 1.0):
            reported.add(names)
            budget = " + ".join(f"{n} {v}" for n, v in declared.items())
            yield error(("roles", last.role, "gpus"),
                        f"GPU {gpu} is shared by {', '.join(names)} and their memory budgets ({budget}) leave "
                        f"no headroom", f"lower mem_fraction so the sum stays under 1.0"
                        f"{' with room for ' + undeclared[0] if undeclared else ''}, or give {last.role} "
                        f"other GPUs", *names)
