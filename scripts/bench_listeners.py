#!/usr/bin/env python3
"""What `status` and `top` pay per reading to tell that each role's listener is the role's own
(proc/listeners.py), at N roles, side by side: one HostView shared by the reading (now) against a fresh
scan of the host's socket tables and processes per role (before). Prints CPU seconds and the exponent
of each against N (1.0: linear in the deployment).

    .venv/bin/python scripts/bench_listeners.py --sizes 2 8 32 128 512
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from muse_launch.proc.listeners import HostView, ListenerOwner  # noqa: E402


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def reading(ports: list[int], shared: bool) -> float:
    started, view = cpu(), HostView() if shared else None
    for port in ports:
        assert ListenerOwner(os.getpid(), "me", {}, view=view).check(port, "127.0.0.1") is None
    return cpu() - started


def exponent(sizes: list[int], seconds: list[float]) -> float:
    return math.log(seconds[-1] / seconds[0]) / math.log(sizes[-1] / sizes[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 8, 32, 128, 512])
    args = parser.parse_args()
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(max(args.sizes))]
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(4)]  # a process tree to walk
    try:
        ports = [s.getsockname()[1] for s in servers]
        rows = [(n, reading(ports[:n], True), reading(ports[:n], False)) for n in args.sizes]
    finally:
        for child in children:
            child.kill()
            child.wait()
        for s in servers:
            s.close()
    print(f"{'roles':>6} {'shared view s':>14} {'per role s':>11} {'ratio':>6}")
    for n, shared, per_role in rows:
        print(f"{n:>6} {shared:>14.4f} {per_role:>11.4f} {per_role / max(shared, 1e-9):>6.1f}")
    sizes = [r[0] for r in rows]
    print(
        f"exponent: shared view {exponent(sizes, [max(r[1], 1e-6) for r in rows]):.2f}, "
        f"per role {exponent(sizes, [max(r[2], 1e-6) for r in rows]):.2f}"
    )


if __name__ == "__main__":
    main()
