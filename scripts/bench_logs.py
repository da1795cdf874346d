"""Role log caps and readers, measured: a writer at 50 MB/s under copy-truncate rotation
(largest on disk, time per rotation, the writer's own rate), and the memory of following / tailing a 300 MB
backlog with one 40 MB line.

    .venv/bin/python scripts/bench_logs.py [--seconds 10] [--rate-mb 50] [--cap-mib 100] [--keep 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from muse_launch.plan.spec import LogPolicy
from muse_launch.proc.process import Marker, open_role_log
from muse_launch.rundir import logfiles
from muse_launch.rundir.logfiles import LogCaps

MiB = 1024 * 1024
WRITER = """
import os, sys, time
fd, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
block = b"".join(b"%09d " % i + b"x" * 90 + b"\\n" for i in range(650))
start, written = time.monotonic(), 0
while time.monotonic() - start < seconds:
    written += os.write(fd, block)
    ahead = written / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
print(written / (time.monotonic() - start) / 1e6)
"""
READER = """
import sys
from pathlib import Path
from muse_launch.rundir.logs import LogFollower, RolePrinter, last_lines
log = Path(sys.argv[1])
if sys.argv[2] == "follow":
    follower = LogFollower({"r": log}, from_end=False)
    with open("/dev/null", "w") as out:
        printer = RolePrinter(out, ["r"], colour=False)
        while not follower.print_new(printer):
            pass
else:
    last_lines(log, 100)
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024)
"""


def flood(directory: Path, rate: float, seconds: float, cap: int, keep: int) -> None:
    log = directory / "flood.log"
    fd = open_role_log(log, Marker("bench", str(directory / "run")), append=False)  # as a role's is
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(fd), str(rate), str(seconds)],
        pass_fds=(fd,),
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(fd)
    caps = LogCaps({"flood": (log, LogPolicy(cap, keep))})
    largest, rotations, rotating = 0, 0, 0.0
    while writer.poll() is None:
        before = log.stat().st_size
        started = time.perf_counter()
        caps.tend()
        if log.stat().st_size < before:
            rotations += 1
            rotating = max(rotating, time.perf_counter() - started)
        largest = max(largest, sum(p.stat().st_size for p in directory.glob("flood.log*")))
        time.sleep(logfiles.LOG_CHECK_SECONDS)
    achieved = float(writer.stdout.read())
    print(
        f"writer at {rate / 1e6:g} MB/s for {seconds:g} s (achieved {achieved:.1f} MB/s, never blocked by "
        "rotation); "
        f"cap {cap / MiB:g} MiB x (1 + keep {keep}) = {cap * (keep + 1) / MiB:g} MiB"
    )
    print(
        f"  largest on disk {largest / MiB:.1f} MiB; {rotations} rotations, the slowest "
        f"{rotating * 1000:.0f} ms "
        f"(copy + truncate, in the supervisor's loop)"
    )


def readers(directory: Path) -> None:
    log = directory / "backlog.log"
    with open(log, "wb") as f:
        for _ in range(26):
            f.write((b"y" * 9999 + b"\n") * 1000)
        for _ in range(40):
            f.write(b"z" * MiB)
    for mode in ("follow", "tail"):
        started = time.perf_counter()
        peak = subprocess.run(
            [sys.executable, "-c", READER, str(log), mode], capture_output=True, text=True, check=True
        ).stdout
        what = "follow (LogFollower) from its start" if mode == "follow" else "last 100 lines"
        print(
            f"{what} of a {log.stat().st_size / 1e6:.0f} MB log (one 40 MiB line): peak RSS "
            f"{float(peak):.0f} MiB, "
            f"{time.perf_counter() - started:.2f} s"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rate-mb", type=float, default=50.0)
    p.add_argument("--cap-mib", type=float, default=100.0)
    p.add_argument("--keep", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        flood(Path(tmp), args.rate_mb * 1e6, args.seconds, int(args.cap_mib * MiB), args.keep)
        readers(Path(tmp))


if __name__ == "__main__":
    main()
