"""What roles whose probes are accepted and never answered cost everybody else.

    .venv/bin/python scripts/bench_hung_probes.py [--from DIR]

One deployment of stand-ins: HUNG roles that accept the probe's connection and never answer, a
role ready 0.5 s after its start, and one that exits 1.5 s after its start. A foreground `up`
runs it with 0 hung roles and with 5; printed side by side: when the quick role was seen ready
(its elapsed time in `up`'s progress) and when the crash was reported (from `up`'s start), and
the ratios 5 hung / 0 hung (goal: 1.0; before the supervisor ran its probes concurrently, five
hung probes delayed a ready by 9.6 s and a crash report by 9.5 s). `--from DIR` runs the
muse-launch checked out in DIR instead (an older commit, for a before/after in one run).
Figures, not asserts: a loaded machine moves them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_bringup import REPO, STAND_IN, free_ports  # noqa: E402  scripts/ is this script's path

HUNG = 5
QUICK_READY = 0.5
CRASH_AFTER = 1.5


def role(port: int, *flags: object) -> dict:
    return {
        "kind": "command",
        "command": [sys.executable, STAND_IN, "--port", "{port}", *map(str, flags)],
        "port": port,
        "ready": {"http": "/health", "interval": 0.05, "timeout": 600},
    }


def run(home: Path, cwd: Path, hung: int) -> tuple[float, float]:
    """(quick role's ready as `up` saw it, seconds from `up`'s start to the crash report)."""
    *hung_ports, quick, crashing = free_ports(hung + 2)
    name = f"hung{hung}"
    path = home.parent / f"{name}.yaml"
    roles = {f"hung{i}": role(p, "--hang") for i, p in enumerate(hung_ports)}
    roles["quick"] = role(quick, "--ready-after", QUICK_READY)
    roles["crashing"] = role(crashing, "--exit-during-startup", 3, "--exit-after", CRASH_AFTER)
    path.write_text(yaml.safe_dump({"version": 1, "name": name, "hardware": "cpu", "roles": roles}))
    started = time.monotonic()
    up = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "up", str(path)],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "MUSE_LAUNCH_HOME": str(home), "PYTHONPATH": str(cwd)},
    )
    quick_ready = crash_seen = float("nan")
    for line in up.stdout:
        words = line.split()
        if words[:2] == ["quick", "ready"]:
            quick_ready = float(words[3].rstrip("s"))
        if words[:2] == ["crashing", "failed"]:
            crash_seen = time.monotonic() - started
    up.wait()
    return quick_ready, crash_seen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--from", dest="source", type=Path, default=REPO, help="a muse-launch checkout to run"
    )
    source = parser.parse_args().source.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        none_ready, none_crash = run(home, source, 0)
        hung_ready, hung_crash = run(home, source, HUNG)
    print(f"muse-launch from {source}")
    print(
        f"quick role (ready {QUICK_READY}s after start) seen ready after: 0 hung {none_ready:.1f}s, "
        f"{HUNG} hung {hung_ready:.1f}s -> {hung_ready / none_ready:.2f} x  (goal 1.0)"
    )
    print(
        f"crash ({CRASH_AFTER}s after start) reported {'':>13}after: 0 hung {none_crash:.2f}s, "
        f"{HUNG} hung {hung_crash:.2f}s -> {hung_crash / none_crash:.2f} x, {hung_crash - none_crash:+.2f}s  "
        f"(goal 1.0)"
    )


if __name__ == "__main__":
    main()
