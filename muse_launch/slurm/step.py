"""In a step on a node whose roles share GPUs: keep the plan's GPUs of the node's, then exec.

    python -m muse_launch.slurm.step --gpus 0,1 -- PROGRAM ARG...

SLURM gave the step all of the node's allocated GPUs and set the visible devices to them; the
plan's indices are positions in that list (index 0: the node's first allocated GPU).
"""

from __future__ import annotations

import os
import signal
import sys

from muse_launch.signals import reset_inherited

VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def narrowed(environ: dict[str, str], positions: list[int]) -> dict[str, str]:
    out = dict(environ)
    for var in VARS:
        if var in environ:
            given = [d for d in environ[var].split(",") if d]
            out[var] = ",".join(given[i] for i in positions if i < len(given))
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[0] != "--gpus" or argv[2] != "--":
        sys.exit("usage: python -m muse_launch.slurm.step --gpus 0,1 -- PROGRAM ARG...")
    positions = [int(g) for g in argv[1].split(",") if g]
    reset_inherited()
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # ignored by this interpreter, not by the role it becomes
        signal.signal(sig, signal.SIG_DFL)
    os.execvpe(argv[3], argv[3:], narrowed(dict(os.environ), positions))


if __name__ == "__main__":
    main(sys.argv[1:])
