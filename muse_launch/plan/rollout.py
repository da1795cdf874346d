"""The decisions of a change to a running deployment, as a pure planner: a rollout's state in, its next step
out (after the LWS DisaggregatedSet planner's ComputeNextStep). Nothing here starts, waits or asks over
HTTP: supervise/change_executor.py performs each step and hands the outcome back (`after`, `failing`), so a
whole
rollout replays in a unit test without processes.

- scale up: every new instance placed before any starts (the executor refuses where there is no room), then
  each brought in, in order; then the routers that take workers on their command line only are restarted
  with the new set. A failure undoes it: each instance it brought in is withdrawn again, last first.
- scale down: the highest replicas leave first, each as a removal (its static routers restarted without it,
  then out of its routers, drained, stopped). A failure undoes it: each instance it took out comes back.
- restart: the instance replaced by a fresh process under the same name. With another instance of its role
  serving, in place; alone, a surge instance carries its traffic meanwhile where there is room for one (in,
  replace, out); with no room, in place only with allow_downtime. A role that static routers route: in place,
  then those routers restarted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# ---- steps: what the executor performs -------------------------------------------------------------------


@dataclass(frozen=True)
class BringIn:
    """Start the instance (placed already), wait until it is ready and wired, register it with its
    routers."""

    instance: str


@dataclass(frozen=True)
class TakeOut:
    """Out of its routers (no new requests), drained (its in-flight count to 0, bounded), stopped."""

    instance: str


@dataclass(frozen=True)
class Stop:
    """Stopped at once: nothing routes around it (a router, an encoder, a command)."""

    instance: str


@dataclass(frozen=True)
class Replace:
    """Taken out (drained where something routes around it) and brought in again under the same name, as a
    fresh process (its generation + 1)."""

    instance: str


@dataclass(frozen=True)
class RestartRouters:
    """The routers of `role` that take workers on their command line only, restarted with its instances as
    they are now plus `change` (-1: the one about to leave)."""

    role: str
    change: int = 0


@dataclass(frozen=True)
class PlaceSurge:
    """Find room for one more instance of `role` (the executor reports it: `Restart.placed`)."""

    role: str


@dataclass(frozen=True)
class BringBack:
    """Undo of a removal: a new instance of the role placed where there is room and brought in."""

    instance: str
    role: str


@dataclass(frozen=True)
class Withdraw:
    """Undo of an instance brought in: removed again as a removal is made (its static routers restarted
    without it, then out, drained, stopped), where it still runs."""

    instance: str


Step = BringIn | TakeOut | Stop | Replace | RestartRouters | PlaceSurge | BringBack | Withdraw


# ---- what the planner answers ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    step: Step


@dataclass(frozen=True)
class Complete:
    pass


@dataclass(frozen=True)
class Blocked:
    """The rollout cannot go on: refused before it began, or failed (and undone as far as it could be)."""

    why: str
    fix: str | None = None
    undone: bool = False  # a failure whose undo steps have all been performed


Next = Progress | Complete | Blocked


# ---- rollouts: the state the planner reads --------------------------------------------------------------


@dataclass(frozen=True)
class _Rollout:
    done: tuple[Step, ...] = ()  # the forward steps performed, in order
    failure: str | None = None  # why a step failed: from then on only undo steps
    fix: str | None = None
    undone: tuple[Step, ...] = ()  # the undo steps performed (or tried: an undo goes on past a failed one)
    to_undo: tuple[Step, ...] = ()  # fixed when it failed

    def forward(self) -> tuple[Step, ...] | Blocked:
        raise NotImplementedError

    def undo(self) -> tuple[Step, ...]:
        return ()

    def after(self, step: Step) -> _Rollout:
        """The state once `step` has been performed (an undo step: performed or tried)."""
        if self.failure is not None:
            return replace(self, undone=(*self.undone, step))
        return replace(self, done=(*self.done, step))

    def failing(self, step: Step, why: str, fix: str | None = None) -> _Rollout:
        """The state once `step` failed: what it did so far is to be undone."""
        if self.failure is not None:  # an undo step failed: the undo goes on with the next
            return self.after(step)
        failed = replace(self, failure=why, fix=fix)
        return replace(failed, to_undo=failed.undo())


@dataclass(frozen=True)
class ScaleUp(_Rollout):
    """`role` to more instances: `placed` are the new ones, placed before any starts."""

    role: str = ""
    placed: tuple[str, ...] = ()
    static_routers: bool = False  # a router routes the role that takes workers on its command line only

    def forward(self) -> tuple[Step, ...]:
        restart = (RestartRouters(self.role),) if self.static_routers else ()
        return (*(BringIn(name) for name in self.placed), *restart)

    def undo(self) -> tuple[Step, ...]:
        return tuple(Withdraw(s.instance) for s in reversed(self.done) if isinstance(s, BringIn))


@dataclass(frozen=True)
class ScaleDown(_Rollout):
    """`role` to fewer instances: `current` its instances now, by replica index; `replicas` how many stay."""

    role: str = ""
    current: tuple[str, ...] = ()
    replicas: int = 1
    static_routers: bool = False
    scalable: bool = True  # its instances are routed around (drained), not just stopped

    def leaving(self) -> tuple[str, ...]:
        return tuple(reversed(self.current))[: max(0, len(self.current) - self.replicas)]

    def forward(self) -> tuple[Step, ...]:
        return tuple(step for name in self.leaving() for step in _removal(name, self))

    def undo(self) -> tuple[Step, ...]:
        out = (TakeOut, Stop)
        return tuple(
            BringBack(s.instance, self.role) for s in self.done if isinstance(s, out)
        )  # in the order they left


@dataclass(frozen=True)
class Removal(_Rollout):
    """One instance out of `role`."""

    role: str = ""
    instance: str = ""
    static_routers: bool = False
    scalable: bool = True

    def forward(self) -> tuple[Step, ...]:
        return _removal(self.instance, self)


def _removal(name: str, of: ScaleDown | Removal) -> tuple[Step, ...]:
    """Its static routers first (no new requests to it), then out: drained where it is routed around."""
    restart = (RestartRouters(of.role, -1),) if of.static_routers else ()
    return (*restart, TakeOut(name) if of.scalable else Stop(name))


@dataclass(frozen=True)
class Addition(_Rollout):
    """One more instance of `role`, placed already."""

    role: str = ""
    instance: str = ""
    static_routers: bool = False

    def forward(self) -> tuple[Step, ...]:
        return (BringIn(self.instance), *((RestartRouters(self.role),) if self.static_routers else ()))


@dataclass(frozen=True)
class NoRoom:
    """Where a surge instance was looked for and none fits: why, and what would make room."""

    why: str
    fix: str | None = None


@dataclass(frozen=True)
class Restart(_Rollout):
    """`instance` replaced by a fresh process of it (or of its relaunched spec)."""

    role: str = ""
    instance: str = ""
    kind: str = ""  # its role's kind: only a worker kind is routed around
    scalable: bool = True
    static_routers: bool = False
    serving_others: bool = False  # another instance of its role is ready
    allow_downtime: bool = False
    placed: str | NoRoom | None = None  # the surge instance placed, or why none could be; None: not looked

    def forward(self) -> tuple[Step, ...] | Blocked:
        if self.scalable and self.static_routers:  # they list it again once restarted
            return (Replace(self.instance), RestartRouters(self.role))
        if self.serving_others or not self.scalable:
            if not self.serving_others and not self.allow_downtime:
                return Blocked(f"{self.instance} is the deployment's only {self.kind}")
            return (Replace(self.instance),)
        looked = PlaceSurge(self.role)
        if self.placed is None:
            return (looked,)
        if isinstance(self.placed, NoRoom):
            if not self.allow_downtime:
                return Blocked(f"no room for a surge instance: {self.placed.why}", self.placed.fix)
            return (looked, Replace(self.instance))
        return (looked, BringIn(self.placed), Replace(self.instance), TakeOut(self.placed))


Rollout = ScaleUp | ScaleDown | Removal | Addition | Restart


def next_step(state: _Rollout) -> Next:
    """What the rollout does next: a step to perform, done, or why it cannot go on."""
    if state.failure is not None:
        if len(state.undone) < len(state.to_undo):
            return Progress(state.to_undo[len(state.undone)])
        return Blocked(state.failure, state.fix, undone=True)
    steps = state.forward()
    if isinstance(steps, Blocked):
        return steps
    if len(state.done) < len(steps):
        return Progress(steps[len(state.done)])
    return Complete()
