"""The batch script: `plan FILE --format sbatch` prints it, `up FILE --on slurm` submits it.

Whole nodes (--exclusive), one task per node; GPUs as --gres=gpu:K with K the most any node
needs. The script runs muse-launch's supervisor on the batch host; if that supervisor is killed,
the script keeps the allocation (and the roles) for `muse-launch down`, as on one host.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..errors import UsageError
from ..plan.build import build_plan
from ..render_text import comment, one_line
from ..topology.model import Topology
from .files import SlurmFiles
from .placement import shape


def batch_command(
    python: str, files: SlurmFiles, rehearse: bool, sets: list[str], fail_fast: bool
) -> list[str]:
    argv = [python, "-m", "muse_launch.slurm.batch", "--run-dir", str(files.run_dir.path)]
    argv += ["--rehearse"] if rehearse else []
    argv += ["--fail-fast"] if fail_fast else []
    for assignment in sets:
        argv += ["--set", assignment]
    return [*argv, str(files.topology)]


def render_script(
    topology: Topology,
    files: SlurmFiles,
    python: str,
    rehearse: bool,
    sets: list[str],
    fail_fast: bool = False,
) -> str:
    """From the file's own plan (the rehearsal keeps its shape): nodes, GPUs, which role goes where."""
    plan = build_plan(topology)
    s = shape(plan, topology)
    lines = [
        "#!/bin/bash",
        directive(f"--job-name={plan.name}"),
        f"#SBATCH --nodes={s.count}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        *([f"#SBATCH --gres=gpu:{s.gpus_per_node}"] if s.gpus_per_node else []),
        directive(f"--output={files.batch_log}"),
        "#",
        comment(
            f"muse-launch: {plan.name}{' (rehearsal)' if rehearse else ''}, {s.count} node(s) mapped "
            f"role by role,"
        ),
        "# the plan's machines onto the allocation's nodes in order:",
    ]
    for i, where in enumerate(s.machines, 1):
        roles = ", ".join(s.by_machine[where]) or "nothing"
        lines.append(comment(f"  {where} -> allocated node {i}: {roles}"))
    for where in s.shared:
        lines.append(
            comment(
                f"  {where}: its roles share GPUs, so each step there gets the node's GPUs and "
                f"keeps the plan's"
            )
        )
    died = (
        f"muse-launch: the supervisor died (exit $code); the roles stay up for "
        f"`muse-launch down {one_line(plan.name)}`"
    )
    lines += [
        "# The supervisor below runs on the batch host and starts each role as a named step on its node",
        "# (srun --nodelist --gres=gpu:K: SLURM sets the visible GPUs). `muse-launch status/logs/down` "
        "follow it.",
        " ".join(shlex.quote(a) for a in batch_command(python, files, rehearse, sets, fail_fast)),
        "code=$?",
        f"if [ ! -e {shlex.quote(str(files.done))} ]; then",
        "  echo " + shlex.quote(died).replace("$code", "'\"$code\"'"),
        "  while :; do sleep 3600; done",
        "fi",
        "exit $code",
        "",
    ]
    return "\n".join(lines)


def directive(option: str) -> str:
    """An `#SBATCH` line. sbatch reads it up to the end of the line, so a value holding a newline would
    end it early and the rest would run as a command: refused (the file's names cannot hold one; the
    state directory, from MUSE_LAUNCH_HOME, could)."""
    if one_line(option) != option:
        raise UsageError(
            f"cannot write #SBATCH {one_line(option)}: it holds a control character",
            fix="point MUSE_LAUNCH_HOME at a directory whose path holds no control character",
        )
    return f"#SBATCH {option}"


def default_python() -> str:
    import sys

    return str(Path(sys.executable))
