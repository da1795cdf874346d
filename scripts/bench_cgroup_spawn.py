"""What a role's own cgroup costs at spawn, side by side in one run: Popen of /bin/true as the runtime
spawns a role (its own session), plain and moved into a fresh cgroup v2 by a preexec_fn before exec
(proc/process.spawn_role). Alternated, `--runs` each; prints medians, the worst, and the ratio.

    .venv/bin/python scripts/bench_cgroup_spawn.py [--runs N]

Needs a cgroup2 this user may create under (root here). Figures, not asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from muse_launch.proc import cgroups


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    runs = parser.parse_args().runs
    paths = [cgroups.create_role_cgroup("bench-cgroup-spawn", f"/bench/{i}", "role") for i in range(runs)]
    if None in paths:
        sys.exit("no cgroup v2 here that this user may create")
    ThreadPoolExecutor(4).map(time.sleep, [0.001] * 8)  # the supervisor has its probe threads
    times: dict[str, list[float]] = {"plain": [], "cgroup": []}
    try:
        for path in paths:
            for mode in ("plain", "cgroup"):
                fd = os.open(path / "cgroup.procs", os.O_WRONLY)
                started = time.perf_counter()
                proc = subprocess.Popen(
                    ["/bin/true"],
                    start_new_session=True,
                    preexec_fn=(lambda fd=fd: os.write(fd, b"0")) if mode == "cgroup" else None,
                )
                times[mode].append(time.perf_counter() - started)
                proc.wait()
                os.close(fd)
    finally:
        for path in paths:
            cgroups.remove(path)
    for mode, spent in times.items():
        print(
            f"{mode:>6}: Popen returns after {statistics.median(spent) * 1e3:.2f} ms median, "
            f"{max(spent) * 1e3:.2f} ms worst ({runs} runs)"
        )
    print(
        f"cgroup / plain: {statistics.median(times['cgroup']) / statistics.median(times['plain']):.1f}x "
        "median"
    )


if __name__ == "__main__":
    main()
