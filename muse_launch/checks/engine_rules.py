"""The engines' start-up rules: whole numbers, choices, each engine's own rules (written beside it in
muse_launch/engines/: modes that exclude each other, wiring), and flags in `args` that a key overrides or
that override a key."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..engines import ENGINES, ROUTER_ENGINES, WORKER, WORKER_ENGINES
from ..engines.argv import as_float, as_int, has_flag, last_value, value
from ..engines.base import RoleView, Rule, WorkerEngine
from .findings import CheckContext, Finding, error, plan_check, warning
from .reading import key_flags, model, origin, parallel, roles


@plan_check
def integer_options(ctx: CheckContext) -> Iterator[Finding]:
    """Sizes, ports and token counts are positive whole numbers (the engine's parser refuses others)."""
    for spec in roles(ctx):
        for flag in WORKER[spec.engine].INTEGER_FLAGS:
            given = last_value(spec.args, flag)
            if given is not None and not (as_int(given) or 0) >= 1:
                yield error(
                    origin(ctx, spec, flag),
                    f"{flag} {given} is not a positive whole number",
                    f"give {flag} a number, e.g. {flag} 4",
                    spec.role,
                )


@plan_check
def engine_choices(ctx: CheckContext) -> Iterator[Finding]:
    """Values each engine's parser accepts for its options (its CHOICES)."""
    for spec in roles(ctx):
        engine = WORKER[spec.engine]
        for flag, choices in engine.CHOICES.items():
            given = last_value(spec.args, flag)
            if given is not None and given not in choices:
                key = next((k for k, flags in engine.KEY_FLAGS.items() if flag in flags), None)
                yield error(
                    origin(ctx, spec, flag, key),
                    f"{flag} {given} is not one {engine.FACTS.title} accepts",
                    f"use one of {', '.join(choices)}",
                    spec.role,
                )


@plan_check
def engine_start_up_rules(ctx: CheckContext) -> Iterator[Finding]:
    """Each engine's own start-up rules (muse_launch/engines/: modes that exclude each other, wiring)."""
    yield from engine_own_rules(ctx, lambda engine: engine.START_UP_RULES)


def engine_own_rules(
    ctx: CheckContext, which: Callable[[WorkerEngine], tuple[Rule, ...]]
) -> Iterator[Finding]:
    """Run each worker engine's rules of one sort on its roles, each problem pointed at where it was set."""
    encoders = tuple(n for n, r in ctx.topology.roles.items() if r.kind == "encoder")
    for name, engine in WORKER.items():
        for rule in which(engine):
            for spec in roles(ctx, (name,)):
                view = RoleView(
                    spec.role, spec.kind, spec.args, model(spec), parallel(ctx, spec), ctx.profile, encoders
                )
                for p in rule(view):
                    make = error if p.severity == "error" else warning
                    yield make(origin(ctx, spec, p.flags, p.key), p.message, p.fix, spec.role)


@plan_check
def args_shadowed(ctx: CheckContext) -> Iterator[Finding]:
    """--host/--port in `args` lose to bind/port (rendered after them); other flags there override their
    key."""
    for spec in roles(ctx, WORKER_ENGINES + ROUTER_ENGINES):
        role = ctx.topology.roles[spec.role]
        engine = ENGINES[spec.engine]
        for flag, key in engine.SHADOWED.items():
            given = last_value(role.args, flag)
            effective = last_value(spec.args, flag)
            if given is not None and given != effective:
                yield warning(
                    origin(ctx, spec, flag),
                    f"{flag} {given} in args is overridden by {key}: {effective}",
                    f"set {key}: {given} and remove {flag} from args",
                    spec.role,
                )
        for flag, ref in engine.WIRING.items():
            if has_flag(role.args, flag) and getattr(role, ref, None):
                yield warning(
                    origin(ctx, spec, flag),
                    f"args give {flag} by hand while {ref}: "
                    f"{', '.join(getattr(role, ref))} wires it; the engine keeps the last one",
                    f"list the roles in {ref}: and remove {flag} from args",
                    spec.role,
                )
        for key, flags in key_flags(spec.engine).items():
            declared = getattr(role, key)
            given = value(role.args, *flags)
            if (
                declared is None
                or given is None
                or str(declared) == given
                or as_float(declared) == as_float(given)
            ):
                continue
            yield warning(
                origin(ctx, spec, flags),
                f"args set {flags[0]} {given}, overriding {key}: {declared}",
                f"keep one: set {key}: {given} and remove {flags[0]} from args",
                spec.role,
            )
