"""`autoscale:` against the file it sits in: the roles it names scale, and their bounds can hold on the GPUs
the host has and within the budget."""

from __future__ import annotations

from collections.abc import Iterator

from ..plan.autoscale import gpus_per_instance
from .findings import CheckContext, Finding, error, plan_check, warning
from .reading import machine

SCALED_KINDS = ("prefill", "decode", "worker")


@plan_check
def autoscale_bounds(ctx: CheckContext) -> Iterator[Finding]:
    auto = ctx.topology.autoscale
    if auto is None:
        return
    roles = ctx.topology.roles
    known = [n for n, r in roles.items() if r.kind in SCALED_KINDS]
    good: list[str] = []
    for name, bounds in auto.roles.items():
        at = ("autoscale", "roles", name)
        role = roles.get(name)
        if role is None or role.kind not in SCALED_KINDS:
            what = "is not a role" if role is None else f"is a {role.kind} role"
            yield error(
                at,
                f"{name} {what}; the autoscaler scales prefill, decode and worker roles",
                f"name one of: {', '.join(known)}" if known else "add a prefill, decode or worker role",
            )
            continue
        if role.nodes:
            yield error(
                at,
                f"{name} runs across nodes (nodes: [...]), and such a role has one instance",
                f"remove {name} from autoscale.roles",
                name,
            )
            continue
        if not bounds.min <= role.replicas <= bounds.max:
            want = min(max(role.replicas, bounds.min), bounds.max)
            yield error(
                ("roles", name, "replicas"),
                f"{name} starts with {role.replicas} replicas, outside its autoscale bounds "
                f"{bounds.min}..{bounds.max}",
                f"set replicas: {want}"
                + (f" with gpus for {want} x {len(role.gpus) // role.replicas}" if role.gpus else ""),
                name,
            )
        good.append(name)
    if auto.targets.ttft is None and any(roles[n].kind in ("prefill", "worker") for n in good):
        yield warning(
            ("autoscale", "targets"),
            "no ttft target: prefill scales on its queued prompts only",
            "give targets.ttft: SECONDS",
        )
    if auto.targets.itl is None and any(roles[n].kind in ("decode", "worker") for n in good):
        yield warning(
            ("autoscale", "targets"),
            "no itl target: decode scales on its queue and KV cache only",
            "give targets.itl: SECONDS",
        )
    yield from _gpu_room(ctx, good)


def _gpu_room(ctx: CheckContext, scaled: list[str]) -> Iterator[Finding]:
    auto = ctx.topology.autoscale
    assert auto is not None
    per = {n: gpus_per_instance(ctx.topology, n) for n in scaled}
    minimum = sum(auto.roles[n].min * per[n] for n in scaled)
    spelled = " + ".join(f"{n} {auto.roles[n].min} x {per[n]}" for n in scaled if per[n])
    if auto.gpus is not None and minimum > auto.gpus:
        yield error(
            ("autoscale", "gpus"),
            f"a budget of {auto.gpus} GPUs is smaller than the minimum's {minimum} ({spelled})",
            f"set gpus: {minimum} or more, or lower the roles' min",
        )
    if not ctx.profile.has_gpus or not any(per.values()):
        return
    # Replicas share the topology's host: the GPUs there, less those of the roles it does not scale.
    hosts = {machine(s) for s in ctx.plan.specs if s.role in scaled}
    others = {g for s in ctx.plan.specs if s.role not in scaled and machine(s) in hosts for g in s.gpus}
    room = ctx.profile.gpus_per_node - len(others)
    if minimum > room:
        first = next(n for n in scaled if per[n])
        fits = (room - (minimum - auto.roles[first].min * per[first])) // per[first]  # the min that fits
        yield error(
            ("autoscale", "roles", first, "min"),
            f"the minimum needs {minimum} GPUs ({spelled}), and a {ctx.topology.hardware} host has "
            f"{room} for these roles",
            f"set {first}'s min to {max(fits, 1)} or lower"
            if fits >= 1
            else "lower the roles' min, or give them fewer GPUs each",
            first,
        )
        return
    for name in scaled:
        if not per[name]:
            continue
        most = (room - (minimum - auto.roles[name].min * per[name])) // per[name]
        if auto.roles[name].max > most:
            yield warning(
                ("autoscale", "roles", name, "max"),
                f"{name} can reach {most} instances at most ({per[name]} GPU{'s' if per[name] > 1 else ''} "
                f"each, the others at their min), not {auto.roles[name].max}",
                f"set max: {most}",
                name,
            )
    budget = auto.gpus
    if budget is not None and budget > room:
        yield warning(
            ("autoscale", "gpus"),
            f"a budget of {budget} GPUs is more than the {room} the host has for these roles",
            f"set gpus: {room}",
        )
