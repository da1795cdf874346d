"""SLURM's client commands (sbatch, squeue, scontrol, scancel), each call in one place.

Everything muse-launch knows of a job comes from these: no slurmdbd (sacct) is needed.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass

from muse_launch.errors import RuntimeFailure

COMMAND_TIMEOUT = 30.0
ACTIVE = (
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "RESIZING",
    "REQUEUED",
    "STAGE_OUT",
    "SIGNALING",
)


def _run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except FileNotFoundError:
        raise RuntimeFailure(
            f"{argv[0]} not found: --on slurm needs SLURM's client commands on PATH "
            f"(on this machine: `bash scripts/slurm_local.sh start`)"
        ) from None
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"`{' '.join(argv)}` did not answer within {COMMAND_TIMEOUT:g}s") from None
    if check and done.returncode != 0:
        raise RuntimeFailure(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def submit(script: str, options: list[str]) -> str:
    """sbatch reads the script from stdin (it is also kept in the run directory); returns the job id."""
    try:
        done = subprocess.run(
            ["sbatch", "--parsable", *options],
            input=script,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
        )
    except FileNotFoundError:
        raise RuntimeFailure(
            "sbatch not found: --on slurm needs SLURM's client commands on PATH "
            "(on this machine: `bash scripts/slurm_local.sh start`)"
        ) from None
    if done.returncode != 0:
        unset = "" if os.environ.get("SLURM_CONF") else "; SLURM_CONF is not set here"
        raise RuntimeFailure(
            f"sbatch refused the job: {(done.stderr or done.stdout).strip()}{unset}",
            fix="check that this host can submit (`sinfo` lists the partitions); for the "
            "local cluster: `bash scripts/slurm_local.sh install`, then in its "
            "namespace "
            '`eval "$(bash scripts/slurm_local.sh start)"` (docs/slurm.md)',
        )
    return done.stdout.strip().split(";")[0]


@dataclass(frozen=True)
class Job:
    id: str
    state: str  # PENDING, RUNNING, ... CANCELLED, FAILED, COMPLETED; "GONE" once SLURM forgot it
    nodes: tuple[str, ...]
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def job(job_id: str) -> Job:
    """The job as slurmctld sees it (finished jobs stay visible for MinJobAge, then GONE)."""
    done = _run(["scontrol", "show", "job", "--oneliner", job_id], check=False)
    if done.returncode != 0:
        return Job(job_id, "GONE", ())
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    state = fields.get("JobState", "UNKNOWN")
    nodelist = fields.get("NodeList", "")
    nodes = hostnames(nodelist) if nodelist and nodelist != "(null)" else ()
    return Job(job_id, state, tuple(nodes), fields.get("Reason", ""))


def hostnames(nodelist: str) -> list[str]:
    return _run(["scontrol", "show", "hostnames", nodelist]).stdout.split()


def node_address(node: str) -> str:
    fields = dict(re.findall(r"(\w+)=(\S*)", _run(["scontrol", "show", "node", "--oneliner", node]).stdout))
    return fields.get("NodeAddr") or node


def steps(job_id: str) -> dict[str, str]:
    """Step name -> step id (JOB.STEP) of the job's running steps, the batch step excepted."""
    done = _run(["squeue", "--steps", "--noheader", "--jobs", job_id, "--format", "%i %j"], check=False)
    out: dict[str, str] = {}
    for line in done.stdout.splitlines():
        step_id, _, name = line.strip().partition(" ")
        if step_id and not step_id.endswith((".batch", ".extern")):
            out[name] = step_id
    return out


def signal_step(step_id: str, signal: str) -> None:
    """The signal to every task of the step, wherever it runs (not to a local srun client)."""
    _run(["scancel", "--quiet", f"--signal={signal.removeprefix('SIG')}", step_id], check=False)


def cancel(job_id: str) -> None:
    _run(["scancel", "--quiet", job_id], check=False)


def wait_gone(job_id: str, seconds: float) -> Job:
    """Until SLURM lists neither the job as active nor any step of it; returns the last view."""
    deadline = time.monotonic() + seconds
    while True:
        seen = job(job_id)
        if (not seen.active and not steps(job_id)) or time.monotonic() > deadline:
            return seen
        time.sleep(0.1)
