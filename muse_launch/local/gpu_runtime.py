"""The host's GPUs in the runtime: `up` refuses GPUs that cannot run the plan before anything starts,
`down` returns once nothing of the deployment holds GPU memory, `status` shows each role's share.

The view of the GPUs is a seam (a reader passed in): NVML / AMD SMI on a GPU host, a saved view or a
fake in tests (muse_launch.host.gpus).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psutil

from muse_launch.errors import RuntimeFailure
from muse_launch.host.gpus import (
    GPU_RELEASE_SECONDS,
    Gpu,
    GpuHolder,
    GpuReader,
    GpuView,
    command_of,
    gib,
    index_ranges,
)
from muse_launch.plan.spec import Plan
from muse_launch.proc import cgroups
from muse_launch.proc.identity import CREATE_TIME_SLACK, start_ticks
from muse_launch.proc.process import MARKER_DEPLOYMENT, MARKER_ROLE, ProcessRef
from muse_launch.rundir.state import DeploymentRecord
from muse_launch.topology.hardware import CHECKPOINT_VRAM_GB, PROFILES, HardwareProfile

if TYPE_CHECKING:  # `down` and `status` import this module, and need no topology schema
    from muse_launch.topology.model import Topology

GPU_POLL_SECONDS = 0.1
GB = 10**9  # checkpoint sizes are in GB, as the recipes state them
SKIP_FLAG = "--skip-gpu-check"


@dataclass(frozen=True)
class GpuNeed:
    """The memory one planned process needs on each of its GPUs."""

    name: str  # the LaunchSpec's
    role: str
    gpus: tuple[int, ...]
    fraction: float | None  # mem_fraction: of each GPU's total
    share_bytes: int | None = None  # else the model's share of each GPU (weights only: a lower bound)
    share_of: str = ""  # where that share comes from
    node: str | None = None  # a multi-node role's node: each node is another host

    def bytes_on(self, gpu: Gpu) -> int | None:
        return int(self.fraction * gpu.total_bytes) if self.fraction is not None else self.share_bytes

    def why(self, gpu: Gpu) -> str:
        if self.fraction is not None:
            return f"{self.name} needs {gib(self.bytes_on(gpu))} GiB (mem_fraction {self.fraction:g})"
        return f"{self.name} needs {gib(self.share_bytes or 0)} GiB ({self.share_of})"


def gpu_needs(plan: Plan, topology: Topology) -> tuple[GpuNeed, ...]:
    """Each GPU process's need: its mem_fraction (the engine flag in its argv wins, as it does for the
    engine),
    else its share of the checkpoint's known size; neither known (a command, an unknown model): no figure."""
    from muse_launch.engines import WORKER

    needs = []
    for spec in plan.specs:
        if not spec.gpus:
            continue
        role = topology.roles[spec.role]
        worker = WORKER.get(spec.engine)  # a command's argv is its own
        fraction = (worker.mem_fraction(spec.args) if worker else None) or role.mem_fraction
        model = (worker.model(spec.args) if worker else None) or role.model or topology.model
        size = (
            CHECKPOINT_VRAM_GB.get(model or "") if spec.kind != "encoder" else None
        )  # encoders load no experts
        gpus_in_all = len(spec.gpus) * max(len(role.nodes), 1)
        share = size * GB // gpus_in_all if size and fraction is None else None
        needs.append(
            GpuNeed(
                spec.name,
                spec.role,
                spec.gpus,
                fraction,
                share,
                f"its share of {model}'s {size} GB over {gpus_in_all} GPUs" if share else "",
                spec.node,
            )
        )
    return tuple(needs)


def one_host(needs: Iterable[GpuNeed]) -> list[GpuNeed]:
    """What one host runs: a multi-node plan's first node (the others are other hosts, alike or not)."""
    needs = list(needs)
    first = next((n.node for n in needs if n.node), None)
    return [n for n in needs if n.node in (None, first)]


@dataclass(frozen=True)
class Leader:
    deployment: str
    role: str
    ref: ProcessRef


def _started_at(pid: int, ref: ProcessRef, or_later: bool) -> bool:
    """The process started when `ref`'s did (or later): by start ticks; by create time for a legacy ref."""
    if ref.verified:
        ticks = start_ticks(pid)
        return ticks is not None and (ticks >= ref.start_ticks if or_later else ticks == ref.start_ticks)
    if ref.start_ticks is None and ref.create_time is not None:
        created = psutil.Process(pid).create_time()
        return (
            created >= ref.create_time - CREATE_TIME_SLACK
            if or_later
            else abs(created - ref.create_time) < CREATE_TIME_SLACK
        )
    return False


class Owners:
    """Which deployment and role a process is of: its marker, its role's cgroup, else the session or the
    ancestor that a role's leader is (an engine that sets its title, like vLLM's EngineCore, blanks its
    marker)."""

    def __init__(self, records: Iterable[DeploymentRecord]):
        records = list(records)
        self.leaders = {
            r.process.pid: Leader(rec.name, r.name, r.process)
            for rec in records
            for r in rec.roles
            if r.process
        }
        self.cgroups = {
            r.cgroup: (rec.name, r.name)
            for rec in records
            for r in rec.roles
            if cgroups.is_role_cgroup(r.cgroup)
        }

    def of(self, pid: int) -> tuple[str, str] | None:
        try:
            proc = psutil.Process(pid)
            try:
                environ = proc.environ()
                if MARKER_ROLE in environ:
                    return environ.get(MARKER_DEPLOYMENT, "?"), environ[MARKER_ROLE]
            except psutil.Error:
                pass
            if self.cgroups and (owner := self.cgroups.get(cgroups.cgroup_of(pid))):
                return owner
            leader = self.leaders.get(os.getsid(pid))
            # Its session is the leader's only while the leader lives: a dead leader's pid may be anyone's
            # now.
            if leader and leader.ref.find() and _started_at(pid, leader.ref, or_later=True):
                return leader.deployment, leader.role
            for ancestor in [proc, *proc.parents()]:
                leader = self.leaders.get(ancestor.pid)
                if leader and _started_at(ancestor.pid, leader.ref, or_later=False):
                    return leader.deployment, leader.role
        except (psutil.Error, OSError):
            pass
        return None

    def label(self, holder: GpuHolder) -> str:
        """Named as a busy port's holder is: pid, the role when it is one of ours, the command line."""
        owner = self.of(holder.pid)
        command = holder.command or command_of(holder.pid)
        role = f"role {owner[1]} of {owner[0]}" if owner else None
        inside = ", ".join(p for p in (role, command) if p)
        return f"pid {holder.pid} ({inside})" if inside else f"pid {holder.pid} (not visible from here)"


def held(gpu: Gpu, owners: Owners, holders: Iterable[GpuHolder] | None = None) -> str:
    """ "GPU 0: 100.6 of 139.8 GiB held by pid 564 (python3 serve.py)"."""
    holders = list(gpu.holders if holders is None else holders)
    if not holders:
        return (
            f"GPU {gpu.index}: {gib(gpu.used_bytes)} of {gib(gpu.total_bytes)} GiB in use, by no process the "
            f"driver lists (another container, or memory being freed)"
        )
    if len(holders) == 1:
        used = holders[0].used_bytes
        amount = f"{gib(used)} of {gib(gpu.total_bytes)} GiB" if used is not None else "memory"
        return f"GPU {gpu.index}: {amount} held by {owners.label(holders[0])}"
    total = sum(h.used_bytes or 0 for h in holders)
    each = ", ".join(
        f"{owners.label(h)}{f' {gib(h.used_bytes)} GiB' if h.used_bytes is not None else ''}" for h in holders
    )
    return f"GPU {gpu.index}: {gib(total)} of {gib(gpu.total_bytes)} GiB held by {each}"


@dataclass(frozen=True)
class GpuProblem:
    text: str
    fix: str

    def __str__(self) -> str:
        return f"{self.text}\n    fix: {self.fix}"


def gpu_problems(
    needs: Iterable[GpuNeed], profile: HardwareProfile, view: GpuView, owners: Owners
) -> tuple[list[GpuProblem], list[str]]:
    """What stops the planned GPUs from running their roles on this host, and notes that do not."""
    needs = list(needs)
    planned = sorted({g for n in needs for g in n.gpus})
    problems: list[GpuProblem] = []
    host = f"{len(view.gpus)} GPU{'s' if len(view.gpus) != 1 else ''}" + (
        f" ({index_ranges(g.index for g in view.gpus)}: {_models(view.gpus)})" if view.gpus else ""
    )
    missing = [(n, [g for g in n.gpus if view.gpu(g) is None]) for n in needs]
    missing = [(n, gpus) for n, gpus in missing if gpus]
    if missing:
        absent = sorted({g for _, gpus in missing for g in gpus})
        problems.append(
            GpuProblem(
                f"GPU {index_ranges(absent)} {'is' if len(absent) == 1 else 'are'} planned "
                f"({'; '.join(f'{n.name} on {index_ranges(gpus)}' for n, gpus in missing)}), but this host "
                f"has {host}",
                f"run the file on a host with {max(planned) + 1} GPUs, or give "
                f"{', '.join(dict.fromkeys(f'roles.{n.role}.gpus' for n, _ in missing))} GPUs of this host",
            )
        )
    present = [view.gpu(g) for g in planned if view.gpu(g) is not None]
    other_model = [g for g in present if not profile.matches_gpu(g.name)]
    if other_model:
        names = _models(other_model)
        suited = next((p for p in PROFILES.values() if p.matches_gpu(other_model[0].name)), None)
        fix = (
            f"write the file for this host (`hardware: {suited.name}`, or `muse-launch init --hardware "
            f"{suited.name} ...`), or run it on {profile.display}"
            if suited
            else f"run it on {profile.display}, or use --skip-gpu-check if this GPU can run it"
        )
        problems.append(
            GpuProblem(
                f"hardware: {profile.name}: the file is written for {profile.display}, but GPU "
                f"{index_ranges(g.index for g in other_model)} of this host "
                f"{'is' if len(other_model) == 1 else 'are'} "
                f"{names}",
                fix,
            )
        )
    notes: list[str] = []
    for gpu in present:
        users = [n for n in needs if gpu.index in n.gpus]
        known = [(n, n.bytes_on(gpu)) for n in users if n.bytes_on(gpu) is not None]
        unknown = [n for n in users if n.bytes_on(gpu) is None]
        need = sum(b for _, b in known)
        if need > gpu.free_bytes:
            whose = " and ".join(n.why(gpu) for n, _ in known) + (
                f", {gib(need)} GiB in all" if len(known) > 1 else ""
            )
            problems.append(
                GpuProblem(
                    f"{held(gpu, owners)}; {gib(gpu.free_bytes)} GiB is free, and {whose}",
                    _memory_fix(gpu, known, owners, view, planned),
                )
            )
        elif unknown and gpu.holders:
            problems.append(
                GpuProblem(
                    f"{held(gpu, owners)}, and {', '.join(n.name for n in unknown)} "
                    f"{'sets' if len(unknown) == 1 else 'set'} no mem_fraction, so whether it fits cannot be "
                    "told",
                    f"{_stop(gpu, owners)}, or set roles.{unknown[0].role}.mem_fraction so the check can "
                    "tell, "
                    f"or use --skip-gpu-check",
                )
            )
        elif gpu.holders:
            notes.append(
                f"{held(gpu, owners)}; {gib(gpu.free_bytes)} GiB free is enough for "
                f"{', '.join(n.name for n in users)}"
            )
    return problems, notes


def _models(gpus: Iterable[Gpu]) -> str:
    names = [g.name for g in gpus]
    return ", ".join(f"{names.count(n)} x {n}" if names.count(n) > 1 else n for n in dict.fromkeys(names))


def _stop(gpu: Gpu, owners: Owners) -> str:
    if not gpu.holders:
        return "find what holds it (`nvidia-smi`), and stop it"
    ours = sorted({owner[0] for h in gpu.holders if (owner := owners.of(h.pid))})
    foreign = [owners.label(h) for h in gpu.holders if owners.of(h.pid) is None]
    return " and ".join(
        [
            *(f"run `muse-launch down {name}`" for name in ours),
            *([f"stop {', '.join(foreign)}"] if foreign else []),
        ]
    )


def _memory_fix(
    gpu: Gpu, known: list[tuple[GpuNeed, int]], owners: Owners, view: GpuView, planned: list[int]
) -> str:
    ways = [_stop(gpu, owners)]
    top, top_bytes = max(known, key=lambda k: k[1])
    if top.fraction is not None:
        room = gpu.free_bytes - (sum(b for _, b in known) - top_bytes)
        most = math.floor(room / gpu.total_bytes * 100) / 100
        if most > 0:
            ways.append(f"lower roles.{top.role}.mem_fraction to {most:.2f} or less")
    idle = [g.index for g in view.gpus if g.index not in planned and not g.holders]
    if idle:
        ways.append(f"give {top.role} GPU {index_ranges(idle)}, which nothing uses")
    return ", or ".join(ways)


@dataclass(frozen=True)
class GpuPreflight:
    """`up`'s GPU check, with what it needs from the file; `read` is the seam to the host."""

    needs: tuple[GpuNeed, ...]
    profile: HardwareProfile
    read: GpuReader
    skipped: str | None = None  # why not to look at all: --skip-gpu-check, a rehearsal

    def require(
        self, plan: Plan, records: Callable[[], Iterable[DeploymentRecord]], say: Callable[[str], None]
    ) -> None:
        """Raises RuntimeFailure naming each problem and its fix; else one line saying what it saw."""
        names = {s.name for s in plan.specs}
        needs = one_host(n for n in self.needs if n.name in names)  # `--only` starts a part of the plan
        if not needs or not self.profile.has_gpus:
            return
        if self.skipped == SKIP_FLAG:  # the operator's own word: nothing is checked
            say(f"GPU check skipped: {self.skipped}")
            return
        view = None if self.skipped else self.read()
        if view is None or not view.available:
            # No driver to ask (a rehearsal, no GPU library): the deployments' records still say who holds
            # which GPU, and a real host would refuse to run two engines on one
            _require_unheld(plan.name, needs, self.profile, records())
            why = self.skipped or f"no GPU library answers here ({view.unavailable if view else ''})"
            say(f"GPU check skipped: {why}")
            return
        owners = Owners(records())  # a holder that is a role of a deployment of ours is named so
        problems, notes = gpu_problems(needs, self.profile, view, owners)
        if problems:
            raise RuntimeFailure(
                f"{plan.name}: the host's GPUs cannot run it; nothing was started:\n  "
                + "\n  ".join(map(str, problems))
            )
        for note in notes:
            say(f"note: {note}")
        planned = sorted({g for n in needs for g in n.gpus})
        say(
            f"GPU{'s' if len(planned) > 1 else ''} {index_ranges(planned)}: "
            f"{_models(view.gpu(g) for g in planned)}, "
            f"with the memory their roles need ({view.source}, read in {view.read_seconds * 1000:.0f} ms)"
        )


def _require_unheld(
    name: str, needs: list[GpuNeed], profile: HardwareProfile, records: Iterable[DeploymentRecord]
) -> None:
    """Refuses planned GPUs that a running instance of another deployment on this host holds by its record,
    and GPUs past the hardware profile's count."""
    from muse_launch.rundir.lifecycle import LOCAL, RoleState

    held: dict[int, str] = {}
    for record in records:
        if record.name == name or record.backend != LOCAL:
            continue
        for role in record.roles:
            if role.state not in (RoleState.STOPPED, RoleState.FAILED):
                for gpu in role.gpus:
                    held.setdefault(gpu, f"{role.name} of {record.name}")
    problems = []
    for need in needs:
        taken = [g for g in need.gpus if g in held]
        if taken:
            whose = ", ".join(sorted({held[g] for g in taken}))
            problems.append(f"{need.name} is planned on GPU {index_ranges(taken)}, which {whose} holds")
        past = [g for g in need.gpus if g >= profile.gpus_per_node]
        if past:
            problems.append(
                f"{need.name} is planned on GPU {index_ranges(past)}, but a {profile.display} host has "
                f"{profile.gpus_per_node} GPUs (0-{profile.gpus_per_node - 1})"
            )
    if problems:
        others = sorted({who.split(" of ", 1)[1] for who in held.values()})
        raise RuntimeFailure(
            f"{name}: the host's GPUs cannot run it; nothing was started:\n  " + "\n  ".join(problems),
            fix=" or ".join(f"`muse-launch down {o}`" for o in others)
            + (", or " if others else "")
            + "give the roles GPUs that nothing holds (`muse-launch status` shows who holds which)",
        )


def preflight_for(plan: Plan, topology: Topology, read: GpuReader, skipped: str | None) -> GpuPreflight:
    return GpuPreflight(gpu_needs(plan, topology), PROFILES[topology.hardware], read, skipped)


def holders_of(
    record: DeploymentRecord, view: GpuView, owners: Owners, seen: Mapping[int, str] | None = None
) -> list[tuple[Gpu, GpuHolder, str]]:
    """The deployment's processes holding GPU memory, with their role: by owner, or as `seen` earlier (pid ->
    role)."""
    role_of = seen or {}
    out = []
    for gpu in view.gpus:
        for holder in gpu.holders:
            owner = owners.of(holder.pid)
            if owner and owner[0] == record.name:
                out.append((gpu, holder, owner[1]))
            elif holder.pid in role_of:
                out.append((gpu, holder, role_of[holder.pid]))
    return out


def role_gpu_memory(record: DeploymentRecord, view: GpuView) -> dict[str, dict[int, int]]:
    """Each role's GPU memory now, per GPU index (a role without any: empty)."""
    out: dict[str, dict[int, int]] = {r.name: {} for r in record.roles}
    for gpu, holder, role in holders_of(record, view, Owners([record])):
        if role in out:
            out[role][gpu.index] = out[role].get(gpu.index, 0) + (holder.used_bytes or 0)
    return out


def deployment_holders(record: DeploymentRecord, view: GpuView) -> dict[int, str]:
    """Before `down` stops them: the GPU holders that are the deployment's (pid -> role), while they can be
    told:
    the driver may list a killed process a moment longer, when it can no longer be told whose it was."""
    return {h.pid: role for _, h, role in holders_of(record, view, Owners([record]))}


@dataclass(frozen=True)
class GpuRelease:
    line: str | None  # "GPUs 0-7 free", or who else holds them
    held: tuple[str, ...] = ()  # the deployment's processes still holding memory after the wait


def await_gpu_release(
    record: DeploymentRecord, read: GpuReader, seen: Mapping[int, str], seconds: float = GPU_RELEASE_SECONDS
) -> GpuRelease:
    """Wait until no process of the deployment (or seen as one before it stopped) holds GPU memory."""
    gpus = sorted({g for r in record.roles for g in r.gpus})
    if not gpus:
        return GpuRelease(None)
    owners = Owners([record])
    deadline = time.monotonic() + seconds
    while True:
        view = read()
        if not view.available:
            return GpuRelease(None)
        ours = holders_of(record, view, owners, seen)
        if not ours or time.monotonic() >= deadline:
            break
        time.sleep(GPU_POLL_SECONDS)
    if ours:
        return GpuRelease(
            None,
            tuple(
                held(g, owners, [h]) + ("" if owners.of(h.pid) else f" (was role {role})")
                for g, h, role in ours
            ),
        )
    others = [g for g in view.gpus if g.index in gpus and g.holders]
    if not others:
        return GpuRelease(f"GPUs {index_ranges(gpus)} free" if len(gpus) > 1 else f"GPU {gpus[0]} free")
    return GpuRelease(
        f"GPUs {index_ranges(gpus)}: nothing of {record.name} holds memory; also held, not by "
        f"{record.name}: " + "; ".join(held(g, owners) for g in others)
    )
