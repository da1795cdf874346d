"""The difference between a running deployment and an edited file's checked plan, as ordered steps.

Pure: both sides come in as `ComparedInstance` values (the running one read back from state.json by the
caller, the new one from the plan through `planned`), and out come the steps that turn the one into the
other, each printable without a secret.

What counts as a change of an instance is what is launched: its program and arguments, its environment,
GPUs, ports, engine and kind. Not its probe, stop or log policy, and not the peer lists it is started with
(a router's `--prefill`/`--decode`/`--worker-urls`, a language worker's `--encoder-urls`): adding or removing
a peer registers or unregisters it at run time, it does not restart the instances that list it. Except where
the file adds or drops an encoder role: a language worker takes its encoders on its command line, so one
whose list changes with it is rolled.

Replicas are grouped into their role. Within a role, a running instance whose launch the plan still holds is
kept (under the name it runs as: `decode` stays `decode` when replicas 1 -> 2 plans `decode-0`); the others
are paired in order, each pair rolled (restarted with the new launch); what is left over is added or removed.

Order keeps capacity: every add first (encoders, then language workers, then the rest, routers last), then the
rolls (one instance at a time), then the removals (language workers before the encoders they list), and a
changed router restarted last, once every worker it will be given is up.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..engines import ENGINES, ROUTER_ENGINES
from .spec import LaunchSpec, Plan

# The order instances are added in (and, reversed, removed in): what others list comes first.
KIND_ORDER = {"encoder": 0, "prefill": 1, "decode": 2, "worker": 3, "command": 4, "router": 5}
_FLAG = re.compile(r"^--?[A-Za-z]")


def peer_flags(engine: str) -> Mapping[str, str]:
    """The flags that list an instance's peers (each engine's WIRING): flag -> the kind listed."""
    known = ENGINES.get(engine)
    return known.WIRING if known else {}


def own_argv(engine: str, argv: Sequence[str]) -> tuple[str, ...]:
    """`argv` without its peer lists: each flag of `peer_flags` with the values after it (up to the next
    flag; `--prefill URL 8998` and `--prefill URL none` take their bootstrap port along)."""
    flags = peer_flags(engine)
    out: list[str] = []
    skipping = False
    for arg in argv:
        if arg in flags:
            skipping = True
            continue
        if skipping and not _FLAG.match(arg):
            continue
        skipping = False
        out.append(arg)
    return tuple(out)


def listed_encoders(engine: str, argv: Sequence[str]) -> tuple[str, ...]:
    """The encoders `argv` lists (each value of a peer flag of kind `encoders`: `--encoder-urls A B`)."""
    flags = {flag for flag, kind in peer_flags(engine).items() if kind == "encoders"}
    out: list[str] = []
    taking = False
    for arg in argv:
        if arg in flags:
            taking = True
        elif taking and not _FLAG.match(arg):
            out.append(arg)
        else:
            taking = False
    return tuple(out)


@dataclass(frozen=True)
class Launch:
    """What an instance runs: equal launches need no restart. argv and env are as shown (secrets redacted);
    `digest` is a salted hash of them in clear, so that a changed secret is seen without being kept; None
    where it was not recorded (a state written by an older muse-launch), and likewise `env`."""

    engine: str
    kind: str
    argv: tuple[str, ...]  # own_argv: peer lists left out
    env: tuple[tuple[str, str], ...] | None
    gpus: tuple[int, ...]
    ports: tuple[tuple[str, int], ...]
    digest: str | None = field(default=None, compare=False)
    encoders: tuple[str, ...] = field(default=(), compare=False)  # a language worker's, as shown

    def same_as(self, other: Launch) -> bool:
        if (self.engine, self.kind, self.argv, self.gpus, self.ports) != (
            other.engine,
            other.kind,
            other.argv,
            other.gpus,
            other.ports,
        ):
            return False
        if self.env is not None and other.env is not None and self.env != other.env:
            return False
        return self.digest is None or other.digest is None or self.digest == other.digest


@dataclass(frozen=True)
class ComparedInstance:
    name: str  # as it runs (running side) or as planned (new side)
    role: str  # the topology role it is an instance of
    launch: Launch
    url: str | None = None  # as shown
    down: str | None = (
        None  # running side: why it does not run now (it failed, it was stopped); None: it runs
    )


def launch_digest(salt: str, spec: LaunchSpec) -> str:
    """The salted SHA-256 of what `spec` launches, in clear: the only trace of its secrets that is kept."""
    body = json.dumps([list(own_argv(spec.engine, spec.argv)), sorted(spec.env.items())])
    return hashlib.sha256(f"{salt}\0{body}".encode()).hexdigest()


def planned(
    plan: Plan, redact: Callable[[str], str], salt: str | None = None
) -> tuple[ComparedInstance, ...]:
    """The plan's instances as the diff sees them; `salt`: the running deployment's (its record's masks), so
    that digests compare; None compares without them."""
    return tuple(
        ComparedInstance(
            s.name,
            s.role,
            Launch(
                s.engine,
                s.kind,
                tuple(redact(a) for a in own_argv(s.engine, s.argv)),
                tuple(sorted((k, redact(v)) for k, v in s.env.items())),
                tuple(s.gpus),
                tuple(sorted(s.ports.items())),
                launch_digest(salt, s) if salt else None,
                tuple(redact(u) for u in listed_encoders(s.engine, s.argv)),
            ),
            redact(s.url) if s.url else None,
        )
        for s in plan.specs
    )


class StepKind(str, Enum):
    ADD = "add"
    ROLL = "roll"  # restart with the new launch, one instance at a time
    REMOVE = "remove"
    RESTART_ROUTER = "restart-router"  # a router restarted with its new launch, its workers registered again


@dataclass(frozen=True)
class Step:
    kind: StepKind
    role: str
    instance: str  # ADD: the name the plan gives it; the others: the name it runs as
    changes: tuple[str, ...] = ()  # ROLL, RESTART_ROUTER: what differs, as shown
    old: ComparedInstance | None = None
    new: ComparedInstance | None = None


@dataclass(frozen=True)
class RoleChange:
    role: str
    before: int  # instances running
    after: int  # instances planned


@dataclass(frozen=True)
class Difference:
    steps: tuple[Step, ...]
    roles: tuple[RoleChange, ...]  # each role with its instance counts, in the new plan's order then removed
    unchanged: tuple[str, ...]  # roles whose every instance is kept as it runs
    kept: tuple[tuple[str, str], ...] = ()  # (running name, planned name) for a kept instance renamed

    @property
    def empty(self) -> bool:
        return not self.steps

    def role(self, name: str) -> RoleChange:
        return next(r for r in self.roles if r.role == name)


def diff(running: Iterable[ComparedInstance], new: Iterable[ComparedInstance]) -> Difference:
    """The steps from `running` to `new`, ordered to keep capacity (see the module's docstring)."""
    running, new = tuple(running), tuple(new)
    order = list(dict.fromkeys([i.role for i in new] + [i.role for i in running]))
    encoder_roles = [{i.role for i in side if i.launch.kind == "encoder"} for side in (running, new)]
    relisted = encoder_roles[0] != encoder_roles[1]  # an encoder role added or dropped
    adds, rolls, removes, routers = [], [], [], []
    counts, unchanged, kept = [], [], []
    for role in order:
        old_side = [i for i in running if i.role == role]
        new_side = [i for i in new if i.role == role]
        counts.append(RoleChange(role, len(old_side), len(new_side)))
        pairs, left_old, left_new = _match(old_side, new_side)
        kept += [(o.name, n.name) for o, n in pairs if o.name != n.name]
        touched = False
        for o, n in pairs:  # the same launch, but not running: started again, as the file wants it
            if o.down:
                kind = StepKind.RESTART_ROUTER if o.launch.engine in ROUTER_ENGINES else StepKind.ROLL
                (routers if kind is StepKind.RESTART_ROUTER else rolls).append(
                    Step(kind, role, o.name, (f"not running ({o.down})",), o, n)
                )
            elif relisted and o.launch.encoders != n.launch.encoders:  # its new list is on its command line
                shown = [" ".join(e.launch.encoders) or "none" for e in (o, n)]
                rolls.append(Step(StepKind.ROLL, role, o.name, (f"encoders {shown[0]} -> {shown[1]}",), o, n))
                touched = True
        for o, n in zip(left_old, left_new, strict=False):
            changed = changes(o.launch, n.launch)
            if n.launch.engine in ROUTER_ENGINES or o.launch.engine in ROUTER_ENGINES:
                routers.append(Step(StepKind.RESTART_ROUTER, role, o.name, changed, o, n))
            else:
                rolls.append(Step(StepKind.ROLL, role, o.name, changed, o, n))
        adds += [Step(StepKind.ADD, role, n.name, new=n) for n in left_new[len(left_old) :]]
        removes += [Step(StepKind.REMOVE, role, o.name, old=o) for o in left_old[len(left_new) :]]
        if not left_old and not left_new and old_side and not any(o.down for o in old_side) and not touched:
            unchanged.append(role)

    def rank(step: Step) -> int:
        return KIND_ORDER.get((step.new or step.old).launch.kind, len(KIND_ORDER))

    steps = (
        sorted(adds, key=rank)
        + sorted(rolls, key=rank)
        + sorted(removes, key=rank, reverse=True)
        + sorted(routers, key=rank)
    )
    return Difference(tuple(steps), tuple(counts), tuple(unchanged), tuple(kept))


def _match(
    old: list[ComparedInstance], new: list[ComparedInstance]
) -> tuple[list[tuple[ComparedInstance, ComparedInstance]], list[ComparedInstance], list[ComparedInstance]]:
    """Running instances kept as they are (paired with a planned one of the same launch), and those left on
    each side, in order."""
    left_new = list(new)
    pairs, left_old = [], []
    for o in old:
        same = next((n for n in left_new if o.launch.same_as(n.launch)), None)
        if same is None:
            left_old.append(o)
        else:
            left_new.remove(same)
            pairs.append((o, same))
    return pairs, left_old, left_new


# ---- what changed, as shown ---------------------------------------------------------------------------


def changes(old: Launch, new: Launch) -> tuple[str, ...]:
    """What differs between two launches, one short phrase each: `args --mem-fraction-static 0.8 -> 0.75`,
    `env FOO=1 (added)`, `gpus 0 -> 1`; both sides as shown (secrets redacted)."""
    out: list[str] = []
    for what, a, b in (("engine", old.engine, new.engine), ("kind", old.kind, new.kind)):
        if a != b:
            out.append(f"{what} {a} -> {b}")
    out += _argv_changes(old.argv, new.argv)
    if old.env is not None and new.env is not None:
        out += _mapping_changes("env", dict(old.env), dict(new.env), "=")
    if old.gpus != new.gpus:
        out.append(f"gpus {_gpus(old.gpus)} -> {_gpus(new.gpus)}")
    out += _mapping_changes("ports", dict(old.ports), dict(new.ports), " ")
    if not out and old.digest and new.digest and old.digest != new.digest:
        out.append("a secret value changed (not shown)")
    return tuple(out) or ("launch changed",)


def _gpus(gpus: tuple[int, ...]) -> str:
    return ",".join(map(str, gpus)) or "none"


def _split(argv: Sequence[str]) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]], list[str]]:
    """(the program part, each flag -> its values, the flags in order)."""
    program: list[str] = []
    flags: dict[str, tuple[str, ...]] = {}
    seen: list[str] = []
    current: str | None = None
    for arg in argv:
        if _FLAG.match(arg):
            name, eq, value = arg.partition("=")
            current = name
            flags[name] = flags.get(name, ()) if name in flags else ()
            if name not in seen:
                seen.append(name)
            if eq:
                flags[name] += (value,)
        elif current is None:
            program.append(arg)
        else:
            flags[current] += (arg,)
    return tuple(program), flags, seen


def _argv_changes(old: Sequence[str], new: Sequence[str]) -> list[str]:
    if tuple(old) == tuple(new):
        return []
    old_program, old_flags, old_order = _split(old)
    new_program, new_flags, new_order = _split(new)
    out = []
    if old_program != new_program:
        out.append(f"program {' '.join(old_program) or '-'} -> {' '.join(new_program) or '-'}")
    for flag in dict.fromkeys(old_order + new_order):
        a, b = old_flags.get(flag), new_flags.get(flag)
        if a == b:
            continue
        if a is None:
            out.append(f"args {' '.join((flag, *b))} (added)")
        elif b is None:
            out.append(f"args {' '.join((flag, *a))} (dropped)")
        else:
            out.append(f"args {flag} {' '.join(a) or '(set)'} -> {' '.join(b) or '(set)'}")
    return out or ["args reordered"]


def _mapping_changes(what: str, old: Mapping[str, object], new: Mapping[str, object], sep: str) -> list[str]:
    out = []
    for key in dict.fromkeys([*old, *new]):
        if key not in new:
            out.append(f"{what} {key} (dropped)")
        elif key not in old:
            out.append(f"{what} {key}{sep}{new[key]} (added)")
        elif old[key] != new[key]:
            out.append(f"{what} {key}{sep}{old[key]} -> {new[key]}")
    return out
