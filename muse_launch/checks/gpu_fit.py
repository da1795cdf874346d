"""GPUs and parallelism: indices, counts, TP x DP x PP against GPUs, shared GPUs' memory, the checkpoint's
VRAM."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator

from ..plan.spec import LaunchSpec
from ..topology.hardware import CHECKPOINT_VRAM_GB
from .findings import CheckContext, Finding, error, plan_check, warning
from .reading import (
    free_gpus,
    gpu_text,
    join,
    key_flags,
    machine,
    mem_fraction,
    model,
    origin,
    parallel,
    roles,
)

MIN_HEADROOM = 0.1  # memory share left to a GPU-sharing role without mem_fraction (the cookbook leaves 0.2)


@plan_check
def gpu_indices(ctx: CheckContext) -> Iterator[Finding]:
    """GPU indices exist on the profile, appear once per role, and CPU profiles take none."""
    profile = ctx.profile
    for name, role in ctx.topology.roles.items():
        gpus = role.gpus or []
        if gpus and not profile.has_gpus:
            yield warning(
                ("roles", name, "gpus"),
                f"{ctx.topology.hardware} has no GPUs, so {name}'s gpus are ignored",
                "remove gpus (CPU serving uses TP across NUMA nodes, not GPU indices)",
                name,
            )
            continue
        for i, gpu in enumerate(gpus):
            if gpu >= profile.gpus_per_node:
                yield error(
                    ("roles", name, "gpus", i),
                    f"GPU {gpu} does not exist: a {profile.name} node has GPUs 0-{profile.gpus_per_node - 1}",
                    f"use GPUs 0-{profile.gpus_per_node - 1} (GPUs on "
                    f"other nodes take the same indices under nodes: [...])",
                    name,
                )
            elif gpus.index(gpu) != i:
                yield error(
                    ("roles", name, "gpus", i), f"GPU {gpu} is listed twice", "list each GPU once", name
                )


@plan_check
def gpus_required(ctx: CheckContext) -> Iterator[Finding]:
    """On a GPU profile an engine worker without gpus would see, and grab, every GPU of the host."""
    if not ctx.profile.has_gpus:
        return
    for spec in roles(ctx):
        if not spec.gpus:
            p = parallel(ctx, spec)
            count = p.ranks // p.nnodes if p and p.ranks % p.nnodes == 0 else 1
            free = free_gpus(ctx, spec, count)
            yield error(
                ("roles", spec.role, "gpus"),
                f"{spec.role} has no gpus on {ctx.topology.hardware}, so it would see every GPU of the host",
                f"give {spec.role} gpus: {free}"
                if free
                else f"give {spec.role} {count} GPUs with gpus: [...]",
                spec.role,
            )


@plan_check
def parallel_fits_gpus(ctx: CheckContext) -> Iterator[Finding]:
    """TP x DP x PP (per node) against the role's GPUs and the profile's GPUs per node."""
    if not ctx.profile.has_gpus:
        return
    per_host = ctx.profile.gpus_per_node
    for spec in roles(ctx):
        p = parallel(ctx, spec)
        if p is None:
            continue
        name = spec.role
        if p.ranks % p.nnodes:
            yield error(
                ("roles", name, "nodes"),
                f"{p.describe()} = {p.ranks} GPUs do not split evenly over {p.nnodes} nodes",
                f"use a node count that divides {p.ranks}, or change tp/pp/dp",
                name,
            )
            continue
        need = p.ranks // p.nnodes
        per_node = " per node" if p.nnodes > 1 else ""
        tp_at = origin(ctx, spec, key_flags(spec.engine)["tp"], "tp")
        if any(gpu >= per_host for gpu in spec.gpus):
            continue  # a GPU the node lacks is the error (gpus_exist): counting it as idle or for tp misleads
        if need > per_host:
            nodes = math.ceil(p.ranks / per_host)
            yield error(
                tp_at,
                f"{p.describe()} needs {need} GPUs{per_node}, but a {ctx.profile.name} node has {per_host}",
                f"lower tp, or span {nodes} nodes with nodes: [...]",
                name,
            )
        elif spec.gpus and need > len(spec.gpus):
            free = free_gpus(ctx, spec, need)
            yield error(
                ("roles", name, "gpus"),
                f"{p.describe()} needs {need} GPUs{per_node}, but {name} has "
                f"{len(spec.gpus)} (GPUs {gpu_text(spec.gpus)})",
                f"give {name} {need} GPUs{f' (e.g. {gpu_text(free)})' if free else ''}, or lower tp to "
                f"{max(1, len(spec.gpus) // (p.ranks // p.tp))}",
                name,
            )
        elif spec.gpus and need < len(spec.gpus):
            idle = spec.gpus[need:]
            yield warning(
                ("roles", name, "gpus"),
                f"{p.describe()} uses {need} of {name}'s {len(spec.gpus)} GPUs; "
                f"{'GPUs' if len(idle) > 1 else 'GPU'} {gpu_text(idle)} "
                f"{'stay' if len(idle) > 1 else 'stays'} idle",
                f"give {name} GPUs {gpu_text(spec.gpus[:need])}, or raise tp to {len(spec.gpus)}",
                name,
            )


@plan_check
def shared_gpus(ctx: CheckContext) -> Iterator[Finding]:
    """GPUs shared by roles need memory budgets that fit (the cookbook: encoder beside prefill at 0.8)."""
    users: dict[tuple[str, int], list[LaunchSpec]] = defaultdict(list)
    for spec in ctx.plan.specs:
        for gpu in spec.gpus:
            users[(machine(spec), gpu)].append(spec)
    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for (_, gpu), specs in sorted(users.items(), key=lambda kv: kv[0][1]):
        if len(specs) > 1:
            groups[tuple(s.name for s in specs)].append(gpu)
    by_name = {s.name: s for s in ctx.plan.specs}
    for names, gpus in groups.items():
        specs = [by_name[n] for n in names]
        last, others = specs[-1], specs[:-1]
        fractions = {s.name: mem_fraction(s) for s in specs}
        undeclared = [s for s in specs if fractions[s.name] is None]
        total = sum(f for f in fractions.values() if f is not None)
        budget = " + ".join(f"{n} {f:g}" for n, f in fractions.items() if f is not None)
        shared = (
            f"GPU{'s' if len(gpus) > 1 else ''} {gpu_text(gpus)} {'are' if len(gpus) > 1 else 'is'} also "
            f"used by {join(s.name for s in others)}"
        )
        free = free_gpus(ctx, last, len(last.gpus))
        move = f"give {last.role} GPUs {gpu_text(free)} or " if free else ""
        if len(undeclared) > 1:
            # The cookbook leaves the encoder at its default and budgets the role beside it.
            budgeted = [s for s in undeclared if s.kind != "encoder"][: len(undeclared) - 1] or undeclared[
                :-1
            ]
            yield error(
                ("roles", last.role, "gpus"),
                f"{shared}, and {join(s.name for s in undeclared)} set no "
                f"mem_fraction, so each takes its engine's default share",
                f"{move}set {join(s.role + '.mem_fraction' for s in budgeted)} (the cookbook runs prefill at "
                f"0.8 beside its encoder)",
                *names,
            )
        elif total > 1.0:
            top = max((s for s in specs if fractions[s.name] is not None), key=lambda s: fractions[s.name])
            yield error(
                ("roles", last.role, "gpus"),
                f"{shared}, and their memory budgets add up to {total:g} ({budget})",
                f"{move}lower {top.role}.mem_fraction so the sum stays below 1.0",
                *names,
            )
        elif undeclared and 1.0 - total < MIN_HEADROOM:
            top = max((s for s in specs if fractions[s.name] is not None), key=lambda s: fractions[s.name])
            most = 1.0 - MIN_HEADROOM - (total - fractions[top.name])
            yield error(
                ("roles", last.role, "gpus"),
                f"{shared}, and {budget} leaves {1.0 - total:.2f} of their memory to {undeclared[0].name}",
                f"{move}lower {top.role}.mem_fraction to {most:.2f} or less",
                *names,
            )


@plan_check
def checkpoint_memory(ctx: CheckContext) -> Iterator[Finding]:
    """The checkpoint's VRAM minimum against the role's GPUs x memory (x nodes); encoders load no experts."""
    profile = ctx.profile
    if not profile.has_gpus:
        return
    for spec in roles(ctx):
        need = CHECKPOINT_VRAM_GB.get(model(spec) or "")
        p = parallel(ctx, spec)
        if spec.kind == "encoder" or need is None or not spec.gpus or p is None:
            continue
        have = len(spec.gpus) * p.nnodes * profile.memory_gb
        if have < need:
            nodes = f" x {p.nnodes} nodes" if p.nnodes > 1 else ""
            least = math.ceil(need / profile.memory_gb)
            span = (
                f" (span {math.ceil(least / profile.gpus_per_node)} nodes)"
                if least > profile.gpus_per_node
                else ""
            )
            yield error(
                ("roles", spec.role, "gpus"),
                f"{model(spec)} needs at least {need} GB of GPU memory; "
                f"{spec.role} has {len(spec.gpus)} GPUs{nodes} x {profile.memory_gb} GB = {have} GB on "
                f"{profile.name}",
                f"give {spec.role} at least {least} GPUs{span}, or a smaller checkpoint",
                spec.role,
            )
