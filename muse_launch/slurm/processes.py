"""The supervisor's `Processes` seam on SLURM: each role instance a named job step on its node.

spawn: `srun` (its client stays on the batch host, relaying the step's output to the role's log)
with the role's node, its GPUs as --gres=gpu:K (SLURM picks them and sets the visible devices;
--exact so two roles on one node never share one) and an even share of the node's CPUs; a role
without GPUs is --gres=none --overlap. stop: the role's stop signal to the step through scancel
(every task, on whichever node), its grace, then SIGKILL to the step; done when SLURM lists the
step no more and the srun client has exited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from muse_launch.plan.spec import LaunchSpec
from muse_launch.proc.process import (
    Marker,
    ProcessRef,
    SpawnedProcess,
    SpawnError,
    StopReport,
    StopTarget,
    open_role_log,
)
from muse_launch.proc.programs import program_path
from muse_launch.rundir.state import RunDir

from . import cluster
from .placement import AllocatedNode, node_gpus

VISIBLE_DEVICES = (
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)
POLL_SECONDS = 0.1
AFTER_KILL_SECONDS = 15.0  # SLURM's KillWait and a node's slurmstepd between them


def srun_argv(spec: LaunchSpec, node: AllocatedNode, cpus: int, shared_gpus: int | None = None) -> list[str]:
    """`srun` for one instance on one node, named after it (squeue --steps, scancel JOB.STEP).

    Where the node's roles share GPUs (`shared_gpus`: the node's count), the step gets them all
    and muse_launch.slurm.step keeps the plan's."""
    argv = [
        "srun",
        f"--job-name={spec.name}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node.name}",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--mem=0",
    ]  # --mem=0: the node's memory, shared by its steps
    if spec.gpus and shared_gpus:
        argv += ["--overlap", f"--gres=gpu:{shared_gpus}"]
    elif spec.gpus:
        argv += ["--exact", f"--gres=gpu:{len(spec.gpus)}", f"--cpus-per-task={max(1, cpus)}"]
    else:
        argv += ["--overlap", "--gres=none"]
    return argv


def shared_gpus(placement: Mapping[str, AllocatedNode], specs: list[LaunchSpec]) -> dict[str, int]:
    """Instance -> its node's GPU count, for the instances on nodes whose roles share GPUs."""
    out: dict[str, int] = {}
    for node in {n.name for n in placement.values()}:
        here = [s for s in specs if placement[s.name].name == node]
        count, shared = node_gpus(here)
        if shared:
            out.update((s.name, count) for s in here)
    return out


def cpu_shares(
    placement: Mapping[str, AllocatedNode],
    specs: list[LaunchSpec],
    cpus_per_node: int,
    gpus_per_node: int = 0,
) -> dict[str, int]:
    """The node's CPUs split among the GPU roles on it (the others overlap them): evenly, or, where the
    allocation's GPUs per node are known, by each one's share of them, so that free GPUs keep their CPUs for
    an instance added while it runs (slurm/change_placement.py)."""
    on_node: dict[str, int] = {}
    for spec in specs:
        if spec.gpus:
            on_node[placement[spec.name].name] = on_node.get(placement[spec.name].name, 0) + len(spec.gpus)
    out = {}
    for s in specs:
        total = max(gpus_per_node, on_node.get(placement[s.name].name, 0))
        out[s.name] = max(1, cpus_per_node * len(s.gpus) // total) if s.gpus else 0
    return out


@dataclass
class SlurmProcesses:
    job_id: str
    run_dir: RunDir
    marker: Marker
    placement: dict[
        str, AllocatedNode
    ]  # an instance added while it runs is placed in (slurm/change_placement.py)
    cpus: dict[str, int]
    shared: Mapping[str, int] = field(default_factory=dict)  # instance -> its node's GPUs, where roles share
    step_ids: dict[str, str] = field(default_factory=dict)
    clients: dict[str, SpawnedProcess] = field(default_factory=dict)

    def spawn(self, spec: LaunchSpec, restart_note: str | None) -> SpawnedProcess:
        log_path = self.run_dir.log(spec.name)
        env = {**os.environ, **spec.env, **self.marker.env(spec.name)}
        for var in VISIBLE_DEVICES:  # SLURM sets them for the step's GPUs; the batch step's must not leak
            env.pop(var, None)
        shared = self.shared.get(spec.name) if spec.gpus else None
        narrow = [
            sys.executable,
            "-m",
            "muse_launch.slurm.step",
            "--gpus",
            ",".join(map(str, spec.gpus)),
            "--",
        ]
        argv = [
            *srun_argv(spec, self.placement[spec.name], self.cpus.get(spec.name, 0), shared),
            *(narrow if shared else []),
            program_path(spec.argv[0], env),
            *spec.argv[1:],
        ]
        try:
            with os.fdopen(open_role_log(log_path, self.marker, append=bool(restart_note)), "wb") as log:
                if restart_note:
                    log.write(f"--- muse-launch: {restart_note} ---\n".encode())
                    log.flush()
                popen = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as e:
            raise SpawnError(f"cannot run srun: {e.strerror}") from e
        self.step_ids.pop(spec.name, None)
        process = SpawnedProcess(popen, ProcessRef.of(popen.pid))
        self.clients[spec.name] = process
        return process

    def listener_owner(self, spec: LaunchSpec, process: SpawnedProcess) -> None:
        """A step's processes run on its node: the batch host cannot see whose listener answers."""
        return None

    def stop(self, targets: list[StopTarget], now: float) -> StepStop:
        """The supervisor's seam (supervise/supervisor.py Processes): signals now, polled until done."""
        return StepStop(self.job_id, targets, now, self.clients, self.step_ids)


class StepStop:
    """Stopping roles' steps, as a state with deadlines (the supervisor's loop polls it, never waits on it):
    their signal now, SIGKILL at the end of each one's grace or on `kill_now`; done once SLURM lists none
    of them and their srun clients (when this process started them) have exited."""

    def __init__(
        self,
        job_id: str,
        targets: list[StopTarget],
        now: float,
        clients: Mapping[str, SpawnedProcess] | None = None,
        known: Mapping[str, str] | None = None,
    ):
        self.job_id = job_id
        self.clients = clients or {}
        self.targets = list(targets)
        self.started = now
        listed = cluster.steps(job_id)
        step_ids = {t.role: listed.get(t.role) or (known or {}).get(t.role) for t in targets}
        for t in targets:
            if step_ids[t.role]:
                cluster.signal_step(step_ids[t.role], t.signal)
            elif (client := self.clients.get(t.role)) is not None and client.poll() is None:
                client.popen.send_signal(signal.Signals[t.signal])  # no step yet: srun cancels its request
        self.remaining = {t.role: t for t in targets}
        self.killed_at: dict[str, float] = {}
        self.killed: list[str] = []
        self.survivors: list[str] = []

    def poll(self, now: float, kill_now: bool = False) -> StopReport | None:
        listed = cluster.steps(self.job_id) if self.remaining else {}
        for role, t in list(self.remaining.items()):
            client = self.clients.get(role)
            client_alive = client is not None and client.poll() is None
            if role not in listed and not client_alive:
                del self.remaining[role]
                continue
            if role not in self.killed_at and (now - self.started >= t.grace or kill_now):
                if role in listed:
                    cluster.signal_step(listed[role], "KILL")
                    self.killed.append(f"{role}: step {listed[role]}")
                if client_alive:
                    client.popen.kill()
                self.killed_at[role] = now
            elif role in self.killed_at and now - self.killed_at[role] > AFTER_KILL_SECONDS:
                self.survivors.append(f"{role}: step {listed.get(role, '?')} still listed after SIGKILL")
                del self.remaining[role]
        if self.remaining:
            return None
        for t in self.targets:
            if (client := self.clients.get(t.role)) is not None:
                client.poll()  # reap it
        return StopReport(tuple(self.killed), tuple(self.survivors))
