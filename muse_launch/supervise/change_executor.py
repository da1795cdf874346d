"""Changes of a running deployment on this host, made by its supervisor one at a time
(supervise/control_socket.py
brings them): an instance added, one taken out, one replaced. What a change does to the roles runs in the
supervisor's loop (`Supervisor.call`); the waiting (ready, wired, drained) and the routers' worker API are
here, in the change's own thread, so the loop goes on watching every other role meanwhile.

- add: a new replica of a worker role, placed by the file's rules (the plan of the file with one more
  replica: its ports and GPUs), checked like `up`'s pre-flight, started, ready, wired (its encoders), then
  registered with every router that routes its role (as its worker type, a prefill with its bootstrap port)
  and listed healthy there. Only then does it count.
- remove: the router stops sending to it first (it leaves the router's desired set and list), then the
  instance drains: its own in-flight count, read from its metrics, must reach 0 (bounded by the drain
  timeout); then it is stopped.
- restart: the instance replaced by a fresh process of the same spec (generation + 1). With another instance
  of its role serving, in place; alone, a surge instance carries its traffic meanwhile, where there is room
  for one; else only with allow_downtime.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import httpx

from muse_launch.backend_types import Say
from muse_launch.change import (
    AddInstance,
    Adopt,
    Change,
    RemoveInstance,
    RestartInstance,
    ScaleRole,
    describe,
)
from muse_launch.engines import ROUTER_ENGINES, router
from muse_launch.errors import NotSupported, RuntimeFailure, UsageError
from muse_launch.host.gpus import index_ranges
from muse_launch.plan.diff import launch_digest
from muse_launch.plan.placement import PORT_FIELDS, Room, choose_gpus, on_gpus
from muse_launch.plan.rollout import (
    Addition,
    Blocked,
    BringBack,
    BringIn,
    Complete,
    NoRoom,
    PlaceSurge,
    Progress,
    Removal,
    Replace,
    Restart,
    RestartRouters,
    Rollout,
    ScaleDown,
    ScaleUp,
    Step,
    TakeOut,
    Withdraw,
    next_step,
)
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.supervise.planned_record import planned_record
from muse_launch.supervise.wiring import Wire, WiringCheck, wiring_checks
from muse_launch.supervise.workers import adds_workers, deregister, in_flight, register

if TYPE_CHECKING:
    from muse_launch.supervise.supervisor import Supervisor

Drained = RemoveInstance | RestartInstance | ScaleRole  # the changes that take an instance out
DRAIN_TIMEOUT = 120.0  # seconds an instance taken out may finish what it serves before it is stopped
DRAIN_POLL = 0.1
DRAIN_RETRY = 0.5  # after an instance did not answer how many requests it has in flight
SCALABLE_KINDS = ("prefill", "decode", "worker")


@dataclass(frozen=True)
class Placement:
    """What placing a new instance needs from `up`: the file's plan with N replicas of a role, and the
    pre-flight of a part of it (ports, GPUs; raises RuntimeFailure)."""

    # role -> its replicas (the others as the file has them); and role -> {port kind: port} its new
    # instance takes instead of its stepped ports (plan/placement.py with_replicas)
    replan: Callable[..., Plan]
    preflight: Callable[..., None]  # (part, say[, reserved]): raises RuntimeFailure
    # The same rules from an edited file, its --set values and `${env:...}` values (`up FILE` of a running
    # deployment)
    reload: Callable[[str, tuple[str, ...], Mapping[str, str]], Placement] | None = None
    redact: Callable[[str], str] = lambda text: text  # hides the file's `${env:...}` values
    sha256: str | None = None  # of the file's bytes as they were read
    # The node's GPUs and who holds them, but for the named deployment's own instances (plan/placement.py);
    # None where GPU indices mean nothing to the backend (SLURM gives a step its GPUs by count).
    room: Callable[[str], Room] | None = None
    hardware: str = ""  # the file's hardware profile: which variable makes an instance's GPUs visible
    port_free: Callable[[str, int], bool] | None = None  # (bind address, port): nothing holds it here


def index_of(name: str, role: str) -> int | None:
    """An instance's replica index: `decode` is 0, `decode-3` is 3."""
    if name == role:
        return 0
    m = re.fullmatch(re.escape(role) + r"-(\d{1,4})", name)
    return int(m[1]) if m else None


class Changes:
    def __init__(self, sup: Supervisor, placement: Placement | None, client: httpx.Client):
        self.sup = sup
        self.placement = placement
        self.client = client
        self.allow_downtime = False  # the change's own --allow-downtime
        self.by_file = False
        # Roles the adopted file has and the deployment did not run when it was adopted, and the reverse:
        # their instances are added (or removed) whatever their kind, the last one too.
        self.new_roles: frozenset[str] = frozenset()
        self.gone_roles: frozenset[str] = frozenset()
        self._wiring_by_plan: dict[str, WiringCheck] = {}
        self._unadopted: tuple[Placement | None, frozenset[str], frozenset[str]] | None = None

    def settle(self, commit: bool, say: Say) -> dict[str, Any]:
        """The end of a lease: a file adopted under it is dropped again unless it ended committed (`up`
        refused, or its client went away, with the file's steps undone or never made)."""
        before, self._unadopted = self._unadopted, None
        if before is not None and not commit:
            self.placement, self.new_roles, self.gone_roles = before
            say(f"{self.sup.plan.name}: later changes planned from the file it had before")
        return {"committed": commit}

    def handle(self, change: Change, leased: bool, say: Say) -> dict[str, Any]:
        """Make one change (read back from the wire as a typed value: change.py), one at a time; `leased`:
        it is one request of a larger change held under a lease (a file adopted under it stands once the
        lease ends committed)."""
        self.allow_downtime = not isinstance(change, Adopt) and change.allow_downtime
        # a step of `up FILE`: the adopted file's roles come and go
        self.by_file = isinstance(change, AddInstance | RemoveInstance) and change.by_file
        if isinstance(change, Adopt):
            before = (self.placement, self.new_roles, self.gone_roles)
            result = self.adopt(change, say)
            self._unadopted = before if leased else None
            return result
        drain = change.drain_timeout if isinstance(change, Drained) else None
        drain = DRAIN_TIMEOUT if drain is None else drain
        self.sup.call(lambda: self.sup.set_change(describe(change)))
        try:
            match change:
                case ScaleRole(role=role, replicas=replicas):
                    return self.scale(role, replicas, drain, say)
                case AddInstance(role=role):
                    return self.add(role, say)
                case RemoveInstance(instance=instance):
                    return self.remove(instance, drain, say)
                case RestartInstance(instance=instance, allow_downtime=allow, relaunch=relaunch):
                    return self.restart(instance, allow, drain, say, relaunch)
        except httpx.HTTPError as exc:
            target = change.role if isinstance(change, ScaleRole | AddInstance) else change.instance
            raise RuntimeFailure(
                f"{change.op} {target}: a router did not answer: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            self.sup.call(lambda: self.sup.set_change(None))
        raise UsageError(f"{change.op}: not a change this supervisor makes")

    # ---- what the supervisor holds, read in its loop ----------------------------------------------

    def _specs(self) -> dict[str, LaunchSpec]:
        return self.sup.call(lambda: {n: r.spec for n, r in self.sup.runs.items()})

    def _instances(self, role: str) -> list[LaunchSpec]:
        return [s for s in self._specs().values() if s.role == role]

    def _routers(self, role: str, static: bool = False) -> dict[str, WiringCheck]:
        """Each router that routes `role` and takes workers at run time (`static`: each that takes them on
        its command line only), and its wiring check (the set it must list)."""

        def read() -> dict[str, WiringCheck]:
            runs = self.sup.runs
            return {
                n: r.wiring
                for n, r in runs.items()
                if r.spec.engine in ROUTER_ENGINES
                and adds_workers(r.spec.engine) is not static
                and r.wiring
                and any(runs[w.peer].spec.role == role for w in r.wiring.wires if w.peer in runs)
            }

        return self.sup.call(read)

    def _counts(self, role: str | None = None, change: int = 0) -> dict[str, int]:
        """Each replicated role's instances now, `role`'s changed by `change`: the plan to render from (a
        role the deployment does not run has the file's replicas)."""
        counts: dict[str, int] = {}
        for spec in self._specs().values():
            if not spec.node:
                counts[spec.role] = counts.get(spec.role, 0) + 1
        if role in counts:
            counts[role] += change
        return counts

    def _restart_routers(self, role: str, counts: dict[str, int], say: Say) -> None:
        """A router that takes its workers on its command line only (vllm-router in PD mode) gets its new
        set by a restart on the file's plan with these replicas; it is ready and wired again after."""
        static = self._routers(role, static=True)
        if not static:
            return
        plan = self.placement.replan(counts)
        checks = wiring_checks(plan)
        for name in static:
            spec = replace(plan.spec(name), role=self._specs()[name].role)
            generation = self.sup.record.role(name).generation + 1
            say(f"{name}: restarting it with {counts[role]} {role} (it takes workers on its command line)")
            self._forget(name)
            self._bring_in(spec, checks.get(name), generation, say)

    def _spec_of(self, instance: str) -> LaunchSpec:
        specs = self._specs()
        if instance not in specs:
            raise UsageError(f"{instance}: no such instance; instances: {', '.join(specs)}")
        return specs[instance]

    # ---- scale: a role to N instances, all or nothing ---------------------------------------------------

    def scale(self, role: str, replicas: object, drain_timeout: float, say: Say) -> dict[str, Any]:
        """`role` to `replicas` instances as one change: every new instance placed before any starts (no
        room: refused, nothing started), then each brought in; the highest replicas taken out first. A
        change that cannot complete is undone (what it started is drained and stopped, what it took out
        comes back) and says so."""
        from muse_launch.topology.model import MAX_REPLICAS  # the file's own cap on `replicas`

        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= MAX_REPLICAS:
            raise UsageError(f"scale {role}: replicas must be a whole number from 1 to {MAX_REPLICAS}")
        current = sorted(self._instances(role), key=lambda s: index_of(s.name, role) or 0)
        if not current:
            names = ", ".join(sorted({s.role for s in self._specs().values()}))
            raise UsageError(f"{role}: no such role; roles: {names}")
        self._refuse_unscalable(current[0])
        before = len(current)
        change = f"scale {role} {before} -> {replicas}"
        if replicas > before:
            placed: list[LaunchSpec] = []
            for _ in range(replicas - before):
                try:
                    placed.append(self.place(role, say, reserved=placed))
                except RuntimeFailure as exc:
                    fits = (
                        f"room for {len(placed)} more ({', '.join(s.name for s in placed)})" if placed else ""
                    )
                    raise RuntimeFailure(
                        f"{change}: {fits + '; ' if fits else ''}{exc}", fix=exc.fix
                    ) from None
            by_name = {spec.name: spec for spec in placed}
            wiring = self._wiring_by_plan
            static = bool(self._routers(role, static=True))
            rollout: Rollout = ScaleUp(role=role, placed=tuple(by_name), static_routers=static)
        else:
            by_name = {spec.name: spec for spec in current}  # by replica index: the highest leave first
            static = bool(self._routers(role, static=True))
            rollout = ScaleDown(role=role, current=tuple(by_name), replicas=replicas, static_routers=static)
            wiring = {}

        def perform(step: Step) -> Any:
            if isinstance(step, BringIn):
                spec = by_name[step.instance]
                self._bring_in(spec, wiring.get(spec.name), 0, say)
                say(f"{spec.name}: serving")
            elif isinstance(step, RestartRouters):
                self._restart_routers(role, self._counts(role, step.change), say)
            elif isinstance(step, TakeOut):
                self._take_out(by_name[step.instance], drain_timeout, say)
            elif isinstance(step, Withdraw):
                say(f"{change}: undoing it: taking {step.instance} out again")
                if step.instance in self._specs():
                    self.remove(step.instance, drain_timeout, say)
            elif isinstance(step, BringBack):
                say(f"{change}: undoing it: bringing {role} back to its instances before")
                again = self.place(role, say)
                self._bring_in(again, self._wiring_of(again), 0, say)

        def undo_failed(step: Step, exc: Exception) -> None:
            what = "taken out" if isinstance(step, Withdraw) else "brought back"
            say(f"{change}: {getattr(step, 'instance', role)} could not be {what}: {exc}")

        _, _, error = self._roll(rollout, perform, undo_failed)
        if error is not None:
            raise self._undone(change, role, before, error) from None
        return {"role": role, "before": before, "instances": self._names(role)}

    def _names(self, role: str) -> list[str]:
        return [s.name for s in sorted(self._instances(role), key=lambda s: index_of(s.name, role) or 0)]

    def _roll(
        self,
        rollout: Rollout,
        perform: Callable[[Step], Any],
        undo_failed: Callable[[Step, Exception], None] = lambda step, exc: None,
    ) -> tuple[Complete | Blocked, dict[Step, Any], Exception | None]:
        """Perform the planner's steps (plan/rollout.py) until it says Complete or Blocked: what each step
        returned, and the failure that ended it, after its undo steps (each tried: one that fails is said by
        `undo_failed`, and the undo goes on). Looking for a surge's room returns what it found: the surge
        placed, or NoRoom."""
        results: dict[Step, Any] = {}
        error: Exception | None = None
        while isinstance(answer := next_step(rollout), Progress):
            step = answer.step
            if rollout.failure is not None:
                try:
                    perform(step)
                except (RuntimeFailure, NotSupported, UsageError, httpx.HTTPError) as exc:
                    undo_failed(step, exc)
                rollout = rollout.after(step)
                continue
            try:
                outcome = perform(step)
            except (RuntimeFailure, NotSupported, httpx.HTTPError) as exc:
                error = exc
                rollout = rollout.failing(step, str(exc), getattr(exc, "fix", None))
                continue
            if isinstance(step, PlaceSurge):  # what it found is a fact the planner decides by
                rollout = replace(rollout, placed=outcome)
            results[step] = outcome
            rollout = rollout.after(step)
        return answer, results, error

    def _undone(self, change: str, role: str, before: int, exc: Exception) -> RuntimeFailure:
        now = self._names(role)
        state = (
            f"undone: {role} has its {before} instance{'s' * (before != 1)} again ({', '.join(now)})"
            if len(now) == before
            else f"not fully undone: {role} has {len(now)} instances now ({', '.join(now)})"
        )
        return RuntimeFailure(f"{change} failed: {exc}; {state}", fix=getattr(exc, "fix", None))

    # ---- add ----------------------------------------------------------------------------------------

    def add(self, role: str, say: Say) -> dict[str, Any]:
        spec = self.place(role, say)
        static = bool(self._routers(role, static=True))

        def perform(step: Step) -> Any:
            if isinstance(step, BringIn):
                return self._bring_in(spec, self._wiring_of(spec), 0, say)
            self._restart_routers(role, self._counts(role, 0), say)

        _, results, error = self._roll(
            Addition(role=role, instance=spec.name, static_routers=static), perform
        )
        if error is not None:
            raise error
        return results[BringIn(spec.name)]

    def place(self, role: str, say: Say, reserved: Sequence[LaunchSpec] = ()) -> LaunchSpec:
        """The next replica of `role`: the file's flags and ports for it, exactly one instance's GPUs from
        those nobody holds (plan/placement.py), checked like `up`'s pre-flight; refused (RuntimeFailure)
        before anything starts where there is no room. `reserved`: instances this change placed and has
        not started yet. A role the adopted file brings in gets the instances that file gives it, of any
        kind."""
        current = self._instances(role)
        names = ", ".join(sorted({s.role for s in self._specs().values()}))
        introduced = self.by_file and role in self.new_roles
        if not current and not introduced:
            raise UsageError(f"{role}: no such role; roles: {names}")
        if not introduced:
            self._refuse_unscalable(current[0])
        if self.placement is None:
            raise NotSupported(f"{role}: this supervisor cannot place new instances (started by `up --only`)")
        used = {index_of(s.name, role) for s in [*current, *reserved] if s.role == role}
        index = next(i for i in range(len(used) + 1) if i not in used)
        counts = self._counts() if introduced else {**self._counts(), role: max(index + 1, 2)}
        plan = self._replan(counts)
        spec = next((s for s in plan.specs if s.role == role and index_of(s.name, role) == index), None)
        if spec is None:
            raise RuntimeFailure(f"{role}: the file's plan has no replica {index} of it")
        if introduced:
            self._refuse_static_routers_of(spec, wiring_checks(plan))
        if moved := self._free_ports(spec, reserved):  # its stepped ports are held: the next free ones
            plan = self._replan(counts, {role: moved})
            spec = next(s for s in plan.specs if s.role == role and index_of(s.name, role) == index)
        self._require_ports(spec, reserved)
        spec = self._on_free_gpus(spec, index, reserved)
        if moved:
            ports = ", ".join(f"{kind} {port}" for kind, port in spec.ports.items())
            say(f"{spec.name}: on ports {ports} (those the file steps to are held)")
        one = Plan(plan.name, (spec,), ((spec.name,),))
        self.placement.preflight(one, say, reserved) if reserved else self.placement.preflight(one, say)
        self._wiring_by_plan = wiring_checks(plan)
        return spec

    def _replan(
        self, counts: Mapping[str, int], ports: Mapping[str, Mapping[str, int]] | None = None
    ) -> Plan:
        if self.placement is None:
            raise NotSupported("this supervisor cannot plan new instances (started by `up --only`)")
        try:
            return self.placement.replan(counts, ports) if ports else self.placement.replan(counts)
        except ValueError as exc:  # a PlanError: the file's rules cannot give these replicas
            raise RuntimeFailure(f"the file's plan with these replicas does not work: {exc}") from None

    def _taken_ports(self, spec: LaunchSpec, reserved: Sequence[LaunchSpec]) -> dict[int, str]:
        return {
            port: other.name
            for other in [*self._specs().values(), *reserved]
            if other.host == spec.host and other.name != spec.name
            for port in other.ports.values()
        }

    def _free_ports(self, spec: LaunchSpec, reserved: Sequence[LaunchSpec]) -> dict[str, int]:
        """For each of the new instance's ports that an instance of this deployment has, or that something
        on the host holds, the next port up that is free (those a role's field sets: plan/placement.py)."""
        taken = self._taken_ports(spec, reserved)
        free = self.placement.port_free if self.placement else None

        def held(port: int) -> bool:
            return port in taken or (free is not None and not free(spec.bind, port))

        used = set(taken) | set(spec.ports.values())
        moved: dict[str, int] = {}
        for kind, port in spec.ports.items():
            if kind not in PORT_FIELDS or not 0 < port < 65536 or not held(port):
                continue
            candidate = port + 1
            while candidate < min(port + 1000, 65536) and (candidate in used or held(candidate)):
                candidate += 1
            if candidate < 65536 and candidate not in used:
                moved[kind] = candidate
                used.add(candidate)
        return moved

    def _require_ports(self, spec: LaunchSpec, reserved: Sequence[LaunchSpec]) -> None:
        """Its ports: in range, and none that an instance of this deployment has (started or placed)."""
        if bad := [p for p in spec.ports.values() if not 0 < p < 65536]:
            raise RuntimeFailure(f"{spec.name}: its port would be {bad[0]}, past 65535")
        taken = self._taken_ports(spec, reserved)
        for key, port in spec.ports.items():
            if port in taken:
                raise RuntimeFailure(
                    f"{spec.name}: its {key} port {port} is {taken[port]}'s; nothing was started",
                    fix=f"give roles.{spec.role} ports that step clear of the other roles' (its `port`, "
                    "`bootstrap_port`), then `up` the file again",
                )

    def _on_free_gpus(
        self,
        spec: LaunchSpec,
        index: int | None,
        reserved: Sequence[LaunchSpec] = (),
        own: tuple[int, ...] = (),
    ) -> LaunchSpec:
        """`spec` on exactly one instance's GPUs (as many as the file gives a replica of its role) that no
        instance of any deployment holds: the file's own for this replica where they are free. `own`: the
        GPUs it holds now and gives up (a relaunch in place)."""
        need = len(spec.gpus)
        if not need or self.placement is None or self.placement.room is None or spec.node:
            return spec
        room = self._room(spec, reserved)
        gpus = choose_gpus(need, room, self._files_gpus(spec.role, index), own)
        if gpus is None:
            raise self._no_room(spec, room, own)
        return on_gpus(spec, gpus, self.placement.hardware)

    def _room(self, spec: LaunchSpec, reserved: Sequence[LaunchSpec] = ()) -> Room:
        assert self.placement is not None and self.placement.room is not None
        mine = [
            s for s in [*self._specs().values(), *reserved] if s.host == spec.host and s.name != spec.name
        ]
        return self.placement.room(self.sup.record.name).holding({g: s.name for s in mine for g in s.gpus})

    def _files_gpus(self, role: str, index: int | None) -> tuple[int, ...]:
        """The GPUs the file itself gives this replica of `role` (none where it has fewer replicas)."""
        try:
            plan = self._replan({})
        except RuntimeFailure:
            return ()
        found = next((s for s in plan.specs if s.role == role and index_of(s.name, role) == index), None)
        if found is None and index == 0:
            found = next((s for s in plan.specs if s.role == role and s.name == role), None)
        return found.gpus if found else ()

    def _no_room(self, spec: LaunchSpec, room: Room, own: tuple[int, ...] = ()) -> RuntimeFailure:
        """What one instance needs, what is free, who holds the rest, and fixes that work when typed."""
        need = len(spec.gpus)
        free = room.free(own)
        by_holder: dict[str, list[int]] = {}
        for gpu in room.gpus:
            if gpu in room.held and gpu not in own:
                by_holder.setdefault(room.held[gpu], []).append(gpu)
        held = "; ".join(f"GPU {index_ranges(gpus)}: {who}" for who, gpus in by_holder.items())
        free_text = f"GPU {index_ranges(free)}" if free else "none"  # "GPU 6, 7" / "none"
        name = self.sup.record.name
        fixes = []
        short = need - len(free)
        for role in sorted({s.role for s in self._specs().values()}):
            instances = self._instances(role)
            per = len(instances[0].gpus) if instances else 0
            if role == spec.role or not per or instances[0].kind not in SCALABLE_KINDS or instances[0].node:
                continue
            drop = -(-short // per)
            if drop < len(instances):
                fixes.append(f"`muse-launch scale {name} {role} {len(instances) - drop}` frees {drop * per}")
        others = sorted({who.split(" of ", 1)[1] for who in by_holder if " of " in who})
        fixes += [f"`muse-launch down {other}`" for other in others]
        fixes.append(
            f"run it on a host with more GPUs, or give roles.{spec.role} fewer GPUs per instance in the file"
        )
        return RuntimeFailure(
            f"{spec.name}: no room on this host: one instance of {spec.role} needs {need} "
            f"GPU{'s' * (need != 1)}; free: {free_text} of {len(room.gpus)} ({room.source}); "
            f"held: {held or 'none'}. Nothing was started",
            fix=", or ".join(fixes),
        )

    def _refuse_static_routers_of(self, spec: LaunchSpec, checks: Mapping[str, WiringCheck]) -> None:
        """A new role's instance that a running router taking workers on its command line only would
        route: that router cannot be given it while it runs."""
        for name, check in checks.items():
            run = self.sup.runs.get(name)
            if run is None or run.spec.engine not in ROUTER_ENGINES or adds_workers(run.spec.engine):
                continue
            if any(w.peer == spec.name for w in check.wires):
                raise NotSupported(
                    f"{spec.role}: {name} ({run.spec.engine}) takes its workers on its command line only, "
                    f"so it cannot be given {spec.name} while it runs",
                    fix=f"`muse-launch down {self.sup.record.name}`, then `up` the file; or route with "
                    "sglang-router or smg, which take workers at run time",
                )

    def _routers_of(self, spec: LaunchSpec) -> dict[str, WiringCheck]:
        """The running routers that take `spec` at run time: those that route its role, and for a role the
        adopted file brings in, those that file wires it to."""
        found = self._routers(spec.role)
        if not self.by_file or spec.role not in self.new_roles:
            return found

        def planned() -> dict[str, WiringCheck]:
            runs = self.sup.runs
            return {
                n: runs[n].wiring
                for n, check in self._wiring_by_plan.items()
                if n in runs
                and runs[n].spec.engine in ROUTER_ENGINES
                and adds_workers(runs[n].spec.engine)
                and runs[n].wiring
                and any(w.peer == spec.name for w in check.wires)
            }

        return {**self.sup.call(planned), **found}

    def _wiring_of(self, spec: LaunchSpec) -> WiringCheck | None:
        return self._wiring_by_plan.get(spec.name)

    def _refuse_unscalable(self, spec: LaunchSpec) -> None:
        if spec.node:
            raise NotSupported(
                f"{spec.role} spans nodes ({spec.name}); a multi-node role cannot get more instances here",
                fix=f"give each replica its own role in the file, or change roles.{spec.role} and `up` again",
            )
        if spec.kind not in SCALABLE_KINDS:
            what = {
                "router": "the deployment's entry point",
                "encoder": "language workers take their encoders on their command line only",
            }.get(spec.kind, f"a {spec.kind} role")
            raise NotSupported(
                f"{spec.role}: {spec.kind} instances are not added or removed while it runs ({what})",
                fix=f"change roles.{spec.role} in the file, then `down` and `up` it",
            )
        self._refuse_static_routers(spec.role)

    def _refuse_static_routers(self, role: str) -> None:
        """A router that takes workers on its command line only changes its set by a restart: that costs the
        requests through it, so only with --allow-downtime."""
        for name in self._routers(role, static=True):
            engine = self._specs()[name].engine
            if self.placement is None:
                raise NotSupported(f"{name} ({engine}) cannot be given a new worker set by this supervisor")
            if not self.allow_downtime:
                raise RuntimeFailure(
                    f"{name} ({engine}) takes its workers on its command line only: in PD mode it refuses a "
                    "worker added while it runs, and one removed cannot come back. muse-launch changes its "
                    "set by restarting it, which breaks the streams in flight through it and refuses "
                    "requests until it is ready again",
                    fix="add --allow-downtime to accept that, or route with sglang-router or smg, which take "
                    "workers at run time (no request fails)",
                )

    def _bring_in(self, spec: LaunchSpec, wiring: WiringCheck | None, generation: int, say: Say) -> dict:
        """Start an instance, wait until it is ready and wired, then register it with its routers."""
        record = planned_record(Plan(spec.name, (spec,), ((spec.name,),)), "", self.sup.redact).roles[0]
        record = replace(
            record,
            generation=generation,
            wiring=wiring.counts(wiring.wires) if wiring else (),
            # digested with the deployment's own salt: `up` of the file compares it with the plan's
            launch_sha256=launch_digest(self.sup.record.masks.salt, spec)
            if self.sup.record.masks.salt
            else None,
        )
        began = time.monotonic()
        if error := self.sup.call(lambda: self.sup.admit(spec, record, wiring)):
            self._forget(spec.name)
            raise RuntimeFailure(f"{spec.name}: could not be started: {error}")
        say(f"{spec.name}: started (pid {self._pid(spec.name)}), waiting until it is ready")
        self._await_ready(spec, say)
        ready = time.monotonic() - began
        say(f"{spec.name}: ready in {ready:.2f}s")
        wire = Wire(spec.name, spec.kind, spec.url or "", spec.ports.get("bootstrap"))
        try:
            for name, check in self._routers_of(spec).items():
                if not any(w.peer == spec.name for w in check.wires):
                    self._enrol(name, check, wire, say)
        except (RuntimeFailure, httpx.HTTPError):
            self._withdraw(spec)  # not counted: out of every router again, and stopped
            raise
        return {
            "instance": spec.name,
            "ready_s": round(ready, 3),
            "counted_s": round(time.monotonic() - began, 3),
        }

    def _enrol(self, name: str, check: WiringCheck, wire: Wire, say: Say) -> None:
        wires = (*check.wires, wire)
        self.sup.call(lambda: self.sup.rewire(name, wires))
        posted = time.monotonic()
        register(self.client, replace(check, wires=wires), wire)
        self._await(lambda: self.sup.runs[name].wired, lambda: self.sup.runs[name].wiring_failed, name)
        what = f"{wire.kind}" + (f", bootstrap port {wire.bootstrap_port}" if wire.bootstrap_port else "")
        say(f"{name}: registered {wire.peer} ({what}); listed healthy in {time.monotonic() - posted:.2f}s")

    def _withdraw(self, spec: LaunchSpec) -> None:
        for name, check in self._routers(spec.role).items():
            wires = tuple(w for w in check.wires if w.peer != spec.name)
            self.sup.call(lambda n=name, w=wires: self.sup.rewire(n, w))
            try:
                deregister(self.client, check, spec.url or "")
            except (RuntimeFailure, httpx.HTTPError):
                pass  # the supervisor's reconcile removes it once the router answers
        self._forget(spec.name)

    def _pid(self, name: str) -> str:
        process = self.sup.record.role(name).process
        return str(process.pid) if process else "?"

    def _await_ready(self, spec: LaunchSpec, say: Say) -> None:
        def failed() -> str | None:
            role = self.sup.record.role(spec.name)
            if role.state is RoleState.FAILED:
                return role.reason or "failed"
            return self.sup.runs[spec.name].wiring_failed

        def ready() -> bool:
            run = self.sup.runs[spec.name]
            return self.sup.record.role(spec.name).state is RoleState.READY and run.wired

        try:
            self._await(ready, failed, spec.name, spec.probe.timeout + 30)
        except RuntimeFailure:
            self._forget(spec.name)
            raise

    def _await(
        self, done: Callable[[], bool], failed: Callable[[], str | None], name: str, timeout: float = 600.0
    ) -> None:
        """Until `done()` holds in the supervisor's loop, which completes the wait (`Supervisor.when`)."""
        waiting = self.sup.when(done, failed)
        try:
            reason = waiting.result(timeout)
        except TimeoutError:
            waiting.cancel()
            raise RuntimeFailure(f"{name}: not ready and wired after {timeout:g}s") from None
        if reason:
            raise RuntimeFailure(
                f"{name}: {reason}", fix=f"`muse-launch logs {self.sup.record.name} {name}` shows why"
            )

    def _forget(self, name: str) -> None:
        """Stop an instance and wait until it has left the supervisor's roles."""
        self.sup.call(lambda: self.sup.retire(name))
        self.sup.when(lambda: name not in self.sup.runs).result()

    # ---- remove -------------------------------------------------------------------------------------

    def remove(self, instance: str, drain_timeout: float, say: Say) -> dict[str, Any]:
        """One instance out. Of a role the adopted file drops (or brought in: `up` undoing what it added),
        any kind and the last one too; else a worker role keeps one."""
        spec = self._spec_of(instance)
        if self.by_file and (spec.role in self.gone_roles or spec.role in self.new_roles):
            self._refuse_static_routers(spec.role)
        else:
            self._refuse_unscalable(spec)
            if len(self._instances(spec.role)) < 2:
                raise UsageError(
                    f"{instance} is the last instance of {spec.role}; a deployment keeps one of each role",
                    fix=f"`muse-launch down {self.sup.record.name}` stops the whole deployment",
                )
        static = bool(self._routers(spec.role, static=True))
        removal = Removal(
            role=spec.role, instance=spec.name, static_routers=static, scalable=spec.kind in SCALABLE_KINDS
        )

        def perform(step: Step) -> Any:
            if isinstance(step, RestartRouters):  # no new requests to it
                return self._restart_routers(spec.role, self._counts(spec.role, step.change), say)
            if isinstance(step, TakeOut):
                return self._take_out(spec, drain_timeout, say)
            began = time.monotonic()  # a router, an encoder, a command: nothing drains through it
            self._forget(spec.name)
            say(f"{spec.name}: stopped in {time.monotonic() - began:.2f}s")
            return {"instance": spec.name}

        _, results, error = self._roll(removal, perform)
        if error is not None:
            raise error
        return results[removal.forward()[-1]]

    def _take_out(self, spec: LaunchSpec, drain_timeout: float, say: Say) -> dict[str, Any]:
        """Out of its routers, drained, stopped."""
        url = (spec.url or "").rstrip("/")
        for name, check in self._routers(spec.role).items():
            wires = tuple(w for w in check.wires if w.peer != spec.name)
            pending = self.sup.call(lambda n=name, w=wires: self.sup.rewire(n, w))
            if pending is not None:  # a re-registration begun before: it must not bring it back after us
                pending.exception(timeout=60)
            deregister(self.client, check, url)  # False: the supervisor's reconcile took it out first
            say(f"{name}: removed {spec.name}; no new requests go to it")
        drained = self._drain(spec, drain_timeout, say) if url else {}
        began = time.monotonic()
        self._forget(spec.name)
        say(f"{spec.name}: stopped in {time.monotonic() - began:.2f}s")
        return {"instance": spec.name, **drained}

    def _drain(self, spec: LaunchSpec, timeout: float, say: Say) -> dict[str, Any]:
        """Wait until the instance's own in-flight count is 0 (read after the router's settle time), at most
        `timeout` seconds."""
        began = time.monotonic()
        settle = began + router.REMOVAL_SETTLE_S
        most, last, seen = 0, None, False
        while time.monotonic() - began < timeout:
            last = in_flight(self.client, spec.engine, spec.url or "")
            if last is None:
                # No answer this time: a busy engine answers its /metrics late (real SGLang on a loaded
                # host did); ask again until the drain timeout rather than stop looking at the first miss
                time.sleep(DRAIN_RETRY)
                continue
            seen = True
            most = max(most, last)
            if last == 0 and time.monotonic() >= settle:
                waited = time.monotonic() - began
                say(f"{spec.name}: drained in {waited:.2f}s ({most} in flight when it left the router)")
                return {"drain_s": round(waited, 3), "in_flight_at_removal": most}
            time.sleep(DRAIN_POLL)
        if not seen:
            say(
                f"{spec.name}: it does not say what it has in flight (no metrics); waited the drain "
                f"timeout ({timeout:g}s) instead"
            )
        elif last is None:
            say(f"{spec.name}: its in-flight count stopped answering; stopping it after the drain timeout")
        else:
            say(f"{spec.name}: still {last} in flight after the drain timeout ({timeout:g}s); stopping it")
        return {"drain_s": round(time.monotonic() - began, 3), "in_flight_at_removal": most}

    # ---- restart ------------------------------------------------------------------------------------

    # ---- adopt: the file later changes are planned from ---------------------------------------------

    def adopt(self, change: Adopt, say: Say) -> dict[str, Any]:
        """`up FILE` of the running deployment: from now on new instances are placed, and relaunched ones
        started, by this file, its --set values and the `${env:...}` values `up` read (not this process's:
        a changed secret is the change). Loaded and checked here as `up` checks it; nothing running is
        touched. The new file's secrets are hidden from then on, in state.json and in what `logs` and
        `down` show, as the first file's are."""
        source, sha256 = change.file, change.sha256
        if self.placement is None or self.placement.reload is None:
            raise NotSupported("this supervisor cannot take a new file (started by `up --only`)")
        if change.env_sha256 is not None:
            self._refuse_other_values(dict(change.env_sha256))
        fresh = self.placement.reload(source, change.sets, {**os.environ, **dict(change.environ)})
        if sha256 and fresh.sha256 != sha256:  # what `up` printed is what is applied
            raise RuntimeFailure(
                f"{source} changed while `up` ran (it is not the file whose difference was printed); "
                "nothing was changed",
                fix="run the same `up` again: it prints the difference the file makes now",
            )
        plan = fresh.replan({})
        if plan.name != self.sup.plan.name:
            raise UsageError(f"{source} names another deployment than {self.sup.plan.name}")
        self.placement = fresh
        running = {s.role for s in self._specs().values()}
        self.new_roles = frozenset({s.role for s in plan.specs} - running)
        self.gone_roles = frozenset(running - {s.role for s in plan.specs})
        shown = {v for s in plan.specs for v in (*s.argv, *s.env.values())}

        def hide_from_now_on() -> None:
            self.sup.redactions.append(fresh.redact)
            self.sup.record = replace(  # `status` names the file it now runs, not the first one
                self.sup.record, source=source, masks=self.sup.record.masks.adding(shown, fresh.redact)
            )
            self.sup.on_change(self.sup.record)

        self.sup.call(hide_from_now_on)
        say(f"{self.sup.plan.name}: later changes planned from {source}")
        return {"file": source}

    def _refuse_other_values(self, digests: Mapping[str, str]) -> None:
        """Where `up` cannot hand its `${env:...}` values over (SLURM: requests are files), it hands their
        salted digests: a value that is not the one this supervisor was started with is refused."""
        salt = self.sup.record.masks.salt
        other = sorted(n for n, d in digests.items() if env_digest(salt, n, os.environ.get(n)) != d)
        if other:
            refs = ", ".join(f"${{env:{n}}}" for n in other)
            raise NotSupported(
                f"{refs}: not the value{'s' * (len(other) > 1)} {self.sup.record.name} was started with; a "
                "new secret is not carried to it while it runs (it would be written to a file); nothing "
                "was changed",
                fix=f"`muse-launch down {self.sup.record.name}`, then `up` the file again with the new value",
            )

    def _relaunched(self, spec: LaunchSpec) -> tuple[LaunchSpec, WiringCheck | None]:
        """The spec the adopted file gives this instance now, with the replicas running, and the wiring that
        file gives it (a language worker's encoders: one the file adds or drops is in it, or not)."""
        if self.placement is None:
            raise NotSupported(f"{spec.name}: this supervisor cannot relaunch (started by `up --only`)")
        plan = self.placement.replan(self._counts(spec.role, 0))
        index = index_of(
            spec.name, spec.role
        )  # `decode` runs on as replica 0 where the file now says decode-0
        new = next(
            (
                s
                for s in plan.specs
                if s.name == spec.name
                or (index is not None and s.role == spec.role and index_of(s.name, spec.role) == index)
            ),
            None,
        )
        if new is None:
            raise RuntimeFailure(f"{spec.name}: the file's plan has no instance of {spec.role} in its place")
        if new.host != spec.host:
            raise NotSupported(
                f"{spec.name}: the edited file places it on {new.host}, not on {spec.host} where it runs",
                fix=f"`muse-launch down {self.sup.record.name}`, then `up` the file again",
            )
        check = wiring_checks(plan).get(new.name)
        # Where it runs, or the file's GPUs for it where they are free: never a share of GPUs others hold
        new = self._on_free_gpus(replace(new, name=spec.name, role=spec.role), index, own=spec.gpus)
        return new, replace(check, role=spec.name) if check else None

    def restart(
        self, instance: str, allow_downtime: bool, drain_timeout: float, say: Say, relaunch: bool = False
    ) -> dict:
        old = self._spec_of(instance)
        wiring = self.sup.call(lambda: self.sup.runs[instance].wiring)
        spec = old
        if relaunch:
            spec, planned = self._relaunched(old)
            if spec.engine not in ROUTER_ENGINES:  # a router keeps the workers it was given since
                wiring = planned
        static = bool(self._routers(spec.role, static=True))
        if spec.kind in SCALABLE_KINDS and static:
            self._refuse_static_routers(
                spec.role
            )  # only with --allow-downtime: requests to it fail meanwhile
        generation = self.sup.record.role(instance).generation + 1
        serving = [
            s
            for s in self._instances(spec.role)
            if s.name != instance and self.sup.record.role(s.name).state is RoleState.READY
        ]
        rollout = Restart(
            role=spec.role,
            instance=instance,
            kind=spec.kind,
            scalable=spec.kind in SCALABLE_KINDS,
            static_routers=static,
            serving_others=bool(serving),
            allow_downtime=allow_downtime,
        )
        surge: list[LaunchSpec] = []

        def perform(step: Step) -> Any:
            if isinstance(step, PlaceSurge):
                try:
                    surge.append(self.place(spec.role, say, reserved=(spec,)))  # not on the GPUs it takes
                except (RuntimeFailure, NotSupported) as exc:
                    if allow_downtime:
                        say(
                            f"{spec.name}: no room for a surge instance ({exc}); --allow-downtime: replacing "
                            "it in place"
                        )
                    return NoRoom(str(exc), exc.fix)
                return surge[0].name
            if isinstance(step, BringIn):
                carrier = surge[0].name
                say(f"{spec.name}: its only instance; {carrier} carries its traffic while it is replaced")
                return self._bring_in(surge[0], self._wiring_of(surge[0]), 0, say)
            if isinstance(step, Replace):
                return self._replace(old, spec, wiring, generation, drain_timeout, say)
            if isinstance(step, TakeOut):
                return self._take_out(surge[0], drain_timeout, say)
            return self._restart_routers(spec.role, self._counts(spec.role, 0), say)  # it lists it again

        end, results, error = self._roll(rollout, perform)
        if error is not None:
            raise error
        if isinstance(end, Blocked):
            raise self._downtime(spec, end.why, end.fix)
        return results[Replace(instance)]

    def _replace(
        self,
        old: LaunchSpec,
        new: LaunchSpec,
        wiring: WiringCheck | None,
        generation: int,
        drain_timeout: float,
        say: Say,
    ) -> dict[str, Any]:
        """`old` taken out (drained where something routes around it), `new` (the same, or its relaunch)
        brought in under the same name."""
        if old.kind in SCALABLE_KINDS:
            out = self._take_out(old, drain_timeout, say)
        else:  # a router or an encoder: nothing routes around it
            self._forget(old.name)
            out = {"instance": old.name}
        back = self._bring_in(new, wiring, generation, say)
        self._recheck_peers(new.name)
        return {**out, **back, "generation": generation}

    def _recheck_peers(self, name: str) -> None:
        """Every role that lists `name` (a language worker its encoder) looks at its list again."""

        def recheck() -> None:
            for run in self.sup.runs.values():
                if run.wiring and any(w.peer == name for w in run.wiring.wires):
                    run.wired, run.wiring_failed = False, None
                    run.wiring_since = self.sup.clock.monotonic()  # its timeout counts from now

        self.sup.call(recheck)

    def _downtime(self, spec: LaunchSpec, why: str, room: str | None = None) -> RuntimeFailure:
        record = self.sup.record.role(spec.name)
        took = _seconds_between(record.started_at, record.ready_at)
        cost = f"about {took:.0f}s, its last start" if took is not None else "its whole start"
        return RuntimeFailure(
            f"restarting {spec.name} would stop what it serves: {why}. Nothing serves {spec.role} for "
            f"{cost}; requests in flight on it and sent meanwhile fail",
            fix="add --allow-downtime to accept that"
            + (f", or make room for a surge instance: {room}" if room else ""),
        )


def env_digest(salt: str, name: str, value: str | None) -> str:
    """A `${env:NAME}` value as a request file may hold it: salted (the deployment's masks' salt), never
    the value; unset differs from every value."""
    body = "\0" if value is None else f"={value}"
    return hashlib.sha256(f"{salt}\0{name}{body}".encode(errors="surrogateescape")).hexdigest()


def _seconds_between(start: str | None, end: str | None) -> float | None:
    from datetime import datetime

    if not start or not end:
        return None
    try:
        return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except ValueError:
        return None
