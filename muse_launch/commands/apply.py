"""`up FILE` on a running deployment of that file: print the difference (plan/diff.py), then apply it through
the deployment's Backend, one step at a time; `--dry-run` prints it and stops. Written once, above the seam:
each backend makes the steps (change.py's AddInstance, RemoveInstance, RestartInstance) or refuses them with
errors.NotSupported, which ends here as one clear error, the deployment left as it was."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from muse_launch.backend_types import Capability
from muse_launch.change import AddInstance, RemoveInstance, RestartInstance, adopt
from muse_launch.errors import NotSupported, RuntimeFailure, UsageError, UserError
from muse_launch.plan.diff import (
    ComparedInstance,
    Difference,
    Launch,
    Step,
    StepKind,
    diff,
    listed_encoders,
    own_argv,
    planned,
)
from muse_launch.plan.diff_text import difference_lines, plan_lines, start_lines, step_line
from muse_launch.plan.rehearse import SIMULATED
from muse_launch.rundir.lifecycle import DeploymentState, RoleState
from muse_launch.rundir.state import LOCAL

if TYPE_CHECKING:
    from muse_launch.backend import Backend
    from muse_launch.core import LoadedPlan
    from muse_launch.plan.spec import Plan
    from muse_launch.rundir.state import DeploymentRecord, RoleRecord, RunDir


def running_record(name: str) -> tuple[RunDir, DeploymentRecord] | None:
    """The deployment of that name when it runs, else None. A damaged state.json of a deployment that is not
    running is left to `up`, which starts it afresh (as it did before it could change one); one whose
    supervisor runs cannot be compared with the file: StateDamaged, whose fix is `down`."""
    from muse_launch.rundir.lifecycle import DeploymentState
    from muse_launch.rundir.state import RunDir, StateDamaged, is_locked, read_state

    run_dir = RunDir.of(name)
    try:
        record = read_state(run_dir)
    except StateDamaged:
        if is_locked(run_dir):
            raise
        return None
    if record is None or record.state is not DeploymentState.STOPPED:
        return None if record is None else (run_dir, record)
    if is_locked(run_dir):  # the state of a run that is over, the lock another `up` or a `down` holds now
        raise RuntimeFailure(
            f"another `up` or a `down` of {name} is under way; nothing was changed",
            fix=f"wait for it (`muse-launch status {name}`), then `up` the file again",
        )
    return None


DOWN = (RoleState.FAILED, RoleState.STOPPED)  # a recorded instance in these states is started again


def _role_of(role: RoleRecord, planned_roles: set[str]) -> str:
    """The topology role of a recorded instance: as recorded, else (an older state) read from its name."""
    if role.role:
        return role.role
    base = role.name.split("@", 1)[0]
    stem, _, index = base.rpartition("-")
    return stem if index.isdigit() and stem in planned_roles else base


def recorded_instances(record: DeploymentRecord, planned_roles: set[str]) -> tuple[ComparedInstance, ...]:
    """The running deployment's instances as state.json keeps them (already checked as untrusted input)."""
    return tuple(
        ComparedInstance(
            r.name,
            _role_of(r, planned_roles),
            Launch(
                r.engine,
                r.kind,
                own_argv(r.engine, r.argv),
                None if r.env is None else tuple(sorted(r.env.items())),
                tuple(r.gpus),
                tuple(sorted(r.ports.items())),
                r.launch_sha256,
                listed_encoders(r.engine, r.argv),
            ),
            r.url,
            None if r.state not in DOWN else f"{r.state.value}{': ' + r.reason if r.reason else ''}",
        )
        for r in record.roles
    )


def _is_rehearsal(argvs) -> bool:
    return any(SIMULATED in tuple(argv)[:4] for argv in argvs)


def difference_of(
    loaded: LoadedPlan,
    record: DeploymentRecord,
    rehearse: bool,
    as_started: Callable[[Plan], Plan] | None = None,
) -> Difference:
    """`as_started`: the file's plan as the deployment's backend runs it (moved onto a SLURM job's nodes);
    else on this host as its `up` runs it, elsewhere as planned."""
    plan = loaded.plan
    if _is_rehearsal(r.argv for r in record.roles) != rehearse:
        running_as = "a rehearsal (--rehearse)" if not rehearse else "with real engines"
        raise UsageError(
            f"{plan.name} runs {running_as}; this `up` would replace every engine of it",
            fix=f"give the same mode as the running deployment ({'with' if not rehearse else 'without'} "
            f"--rehearse), or `muse-launch down {plan.name}` first",
        )
    if as_started is not None:
        plan = as_started(plan)
    elif record.backend == LOCAL:
        plan = _as_started_here(loaded, record, rehearse)
    roles = {s.role for s in plan.specs}
    return diff(recorded_instances(record, roles), planned(plan, loaded.redact, record.masks.salt or None))


def _as_started_here(loaded: LoadedPlan, record: DeploymentRecord, rehearse: bool) -> Plan:
    """The plan as this host's `up` runs it: its start policy may set an engine's variable (the encoder
    eviction TTL of an overlapped start); with the versions the running deployment recorded, so that an
    unchanged file adds nothing."""
    from muse_launch.plan.compose import compose

    versions = {e: v.removesuffix(" (simulated)") if v else v for e, v in record.versions.items()}
    return compose(loaded.loaded.topology, rehearse=rehearse, versions=versions).plan


def print_difference(say: Callable[[str], None], name: str, source: str, difference: Difference) -> None:
    if difference.empty:
        say(f"{name}: running, and {source} changes nothing of it; nothing to do")
        return
    say(f"{name}: running; {source} changes it ({len(difference.steps)} steps):")
    for line in difference_lines(difference):
        say(f"  {line}")
    say("plan:")
    for line in plan_lines(difference):
        say(f"  {line}")


def print_would_start(say: Callable[[str], None], loaded: LoadedPlan) -> None:
    plan = loaded.plan
    say(f"{plan.name} is not running; `up` would start {len(plan.specs)} instances, in this order:")
    for line in start_lines(planned(plan, loaded.redact)):
        say(f"  {line}")


@dataclass
class Applied:
    """What the application did, for the error that stops it and for undoing it."""

    done: list[Step] = field(default_factory=list)
    added: list[tuple[str, str]] = field(default_factory=list)  # (role, instance as the backend named it)
    removed: list[str] = field(default_factory=list)  # the roles of the instances it removed


def _instances(backend: Backend, run_dir: RunDir) -> set[str]:
    from muse_launch.rundir.state import read_state

    record = read_state(run_dir)
    return {r.name for r in backend.observe(record).roles} if record else set()


def relaunches(backend: Backend) -> bool:
    """Whether the backend can take the edited file (Adopt) and restart an instance with the launch it
    gives now (RestartInstance(relaunch=True))."""
    return backend.can(Capability.RELAUNCH)


def refuse_what_the_seam_cannot_carry(difference: Difference, backend: Backend, name: str) -> None:
    """Before any step. A changed launch, and a role the running deployment does not have (placed by the
    edited file), need a backend that `relaunches` (takes the file: `adopt`). Refused with nothing changed,
    the error saying what is applied live instead."""
    new_launch = [
        s.instance
        for s in difference.steps
        if s.kind in (StepKind.ROLL, StepKind.RESTART_ROUTER) and not (s.old and s.old.down)
    ]
    new_launch = [] if relaunches(backend) else new_launch
    new_roles = [
        s.instance for s in difference.steps if s.kind is StepKind.ADD and difference.role(s.role).before == 0
    ]
    new_roles = [] if backend.can(Capability.ADDS_ROLES) else new_roles
    if not new_launch and not new_roles:
        return
    parts = [f"a new launch of {', '.join(new_launch)}"] if new_launch else []
    if new_roles:
        parts.append(f"the new role instance{'s' if len(new_roles) > 1 else ''} {', '.join(new_roles)}")
    why = (
        "its restart starts the launch an instance already runs"
        if new_launch
        else "it places a new role's instances by the allocation it was started with"
        if relaunches(backend)
        else "it places instances by the file it was started with"
    )
    rest = "a change of replicas alone (the file's other changes undone) is made while it runs"
    raise NotSupported(
        f"{name}: {'; '.join(parts)}: not made while it runs on {backend.name} ({why}); nothing was changed",
        fix=f"`muse-launch down {name}`, then `up` the file again; {rest}",
    )


def _make(backend: Backend, run_dir: RunDir, step: Step, instances: Callable[[], set[str]]) -> str | None:
    """The step; for an add, the new instance's name (as the backend returns it, else as it appears)."""
    if step.kind is StepKind.ADD:
        before = instances()
        named = backend.change(run_dir, AddInstance(step.role, by_file=True)).get("instance")
        appeared = sorted(instances() - before)
        return named if isinstance(named, str) and named else (appeared[0] if appeared else None)
    if step.kind is StepKind.REMOVE:
        backend.change(run_dir, RemoveInstance(step.instance, by_file=True))
    else:  # with the launch the adopted file gives it, where the backend took the file
        backend.change(run_dir, RestartInstance(step.instance, relaunch=relaunches(backend)))
    return None


def execute(
    difference: Difference,
    backend: Backend,
    run_dir: RunDir,
    say: Callable[[str], None],
    instances: Callable[[], set[str]] | None = None,
    redact: Callable[[str], str] = lambda text: text,
    applied: Applied | None = None,
) -> None:
    """Each step in order. A refusal (NotSupported) undoes what this run added and removed and says so: the
    deployment is left as it was. Another failure stops there, saying what was applied and what was not.
    `redact`: what the backend says goes out with the file's `${env:...}` values hidden."""
    instances = instances or (lambda: _instances(backend, run_dir))
    told = say
    say = lambda text: told(redact(text))  # noqa: E731
    applied = applied if applied is not None else Applied()
    total = len(difference.steps)
    for i, step in enumerate(difference.steps, 1):
        say(f"[{i}/{total}] {step_line(step)}")
        try:
            added = _make(backend, run_dir, step, instances)
        except NotSupported as refused:
            raise _hidden(_refusal(refused, backend, run_dir, applied, say), redact) from None
        except UserError as failed:  # no change half done: what it added and removed is undone
            left = _undo(backend, run_dir, applied, say) if applied.added or applied.removed else None
            raise _hidden(_stopped(failed, difference, applied, i, run_dir.name, left), redact) from None
        applied.done.append(step)
        if added:
            applied.added.append((step.role, added))
        if step.kind is StepKind.REMOVE:
            applied.removed.append(step.role)
    say(f"{run_dir.name}: applied ({total} steps)")


def _hidden(error: UserError, redact: Callable[[str], str]) -> UserError:
    return type(error)(redact(str(error)), fix=redact(error.fix) if error.fix else None)


def _undo(backend: Backend, run_dir: RunDir, applied: Applied, say: Callable[[str], None]) -> list[str]:
    """Removes what this run added and adds back an instance for each it removed (same launch: the removed
    one's); returns what could not be undone, or was not undoable (an instance restarted)."""
    left = [
        f"{s.kind.value} {s.instance}"
        for s in applied.done
        if s.kind in (StepKind.ROLL, StepKind.RESTART_ROUTER)
    ]
    for role in reversed(applied.removed):
        say(f"undo: adding back an instance of {role}, which this `up` removed")
        try:
            backend.change(run_dir, AddInstance(role, by_file=True))
        except UserError as exc:
            say(f"undo: {role} stays one instance short: {exc}")
            left.append(f"remove of an instance of {role}")
    for _, name in reversed(applied.added):
        say(f"undo: removing {name}, which this `up` added")
        try:
            backend.change(run_dir, RemoveInstance(name, by_file=True))
        except UserError as exc:
            say(f"undo: {name} stays: {exc}")
            left.append(f"add {name}")
    return left


def _refusal(
    refused: NotSupported, backend: Backend, run_dir: RunDir, applied: Applied, say: Callable[[str], None]
) -> NotSupported:
    left = _undo(backend, run_dir, applied, say)
    state = f"left applied before the refusal: {', '.join(left)}" if left else "nothing was changed"
    return NotSupported(
        f"{refused} ({state})",
        fix=refused.fix or f"`muse-launch down {run_dir.name}`, then `up` the file again",
    )


def _stopped(
    failed: UserError,
    difference: Difference,
    applied: Applied,
    at: int,
    name: str,
    left: list[str] | None = None,
) -> RuntimeFailure:
    """`left`: where the instances it added and removed were undone, what stays applied (restarts)."""
    done = ", ".join(f"{s.kind.value} {s.instance}" for s in applied.done) or "none"
    pending = ", ".join(f"{s.kind.value} {s.instance}" for s in difference.steps[at - 1 :])
    if left is not None:
        undone = [
            f"{s.kind.value} {s.instance}"
            for s in applied.done
            if s.kind in (StepKind.ADD, StepKind.REMOVE) and f"{s.kind.value} {s.instance}" not in left
        ]
        done = f"undone: {', '.join(undone) or 'none'}; left applied: {', '.join(left) or 'none'}"
    else:
        done = f"applied: {done}"
    return RuntimeFailure(
        f"step {at} failed: {failed}; {done}; not applied: {pending}",
        fix=failed.fix or f"`muse-launch status {name}` shows where it is; `up` the file again to go on",
    )


def up_changes(
    loaded: LoadedPlan,
    on: str | None,
    rehearse: bool,
    dry_run: bool,
    say: Callable[[str], None],
    sets: tuple[str, ...] = (),
) -> int | None:
    """`up FILE` of a deployment that runs: the exit code once its difference is printed (and, without
    `dry_run`, applied). None: nothing of that name runs and `up` starts it as usual."""
    from muse_launch.backends import backend_of

    found = running_record(loaded.plan.name)
    if found is None:
        if not dry_run:
            return None
        print_would_start(say, loaded)
        say("--dry-run: nothing was started")
        return 0
    run_dir, record = found
    backend = backend_of(run_dir)
    if (on or "local") != backend.name:
        where = {"local": "this host", "slurm": "SLURM", "k8s": "Kubernetes"}.get(backend.name, backend.name)
        raise RuntimeFailure(  # one name, one deployment: it holds the name where it runs
            f"deployment {record.name!r} is up on {where}, not {'--on ' + on if on else 'this host'}; `up` "
            "changes a running deployment where it runs",
            fix=f"`up {'--on ' + backend.name + ' ' if backend.name != 'local' else ''}FILE` changes it "
            f"there; to move it, `muse-launch down {record.name}` first",
        )
    record = backend.observe(record)  # as it runs now: a role that died unseen shows failed
    if backend.name == LOCAL and record.supervisor is None:  # an earlier run left it (`up --keep`)
        if not dry_run:
            return None  # as before: `up` refuses what is left of it, or starts it afresh
        say(f"{record.name}: no supervisor watches it; `up` starts it afresh once what is left of it stops")
        print_would_start(say, loaded)
        return 0
    # a backend that moves the plan as its `up` did
    moves = backend.can(Capability.MOVES_PLAN)
    as_started = (lambda plan: backend.plan_as_started(run_dir, loaded, rehearse)) if moves else None
    difference = difference_of(loaded, record, rehearse, as_started)
    print_difference(say, record.name, str(loaded.source), difference)
    if dry_run:
        if not difference.empty:
            say("--dry-run: nothing was changed; the same `up` without --dry-run applies it")
        return 0
    if difference.empty:
        return 0
    state = record.state
    if state in (DeploymentState.STARTING, DeploymentState.STOPPING):
        raise RuntimeFailure(
            f"{record.name} is {state.value}: nothing was changed",
            fix=f"once `muse-launch status {record.name}` shows it ready, `up` the file again",
        )
    refuse_what_the_seam_cannot_carry(difference, backend, record.name)
    # One change from the adoption to the last step: no other is served between them, and the adopted file
    # stands only where the steps were applied (a refusal that undid them leaves the file it had).
    applied = Applied()
    with backend.held(run_dir, f"up of {loaded.source.name}", say) as held:
        if relaunches(backend):  # what it adds and relaunches is planned from this file from now on
            # with the `${env:...}` values read here: a changed secret is what the difference was made of
            environ = {n: os.environ[n] for n in loaded.loaded.env_names if n in os.environ}
            source, hidden = str(loaded.source.resolve()), lambda text: say(loaded.redact(text))
            backend.change(run_dir, adopt(source, sets, environ, loaded.loaded.sha256), hidden)
        try:
            execute(difference, backend, run_dir, say, redact=loaded.redact, applied=applied)
        except NotSupported:
            raise  # refused: what it applied was undone (or it says what was left)
        except UserError:
            held.commit = bool(applied.done)  # stopped part-way: the steps made stand on the file
            raise
        held.commit = True
    return 0
