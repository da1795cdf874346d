"""EPD and PD bring-up in rehearsal, `start: overlap` against `start: waves`, each against its own
critical path, side by side in one run.

    .venv/bin/python scripts/bench_start_policy.py [--scale S]

Start-up delays in the proportions of a real deployment: encoder 1, language workers 5
(times S seconds, default 1); the router is the real sglang-router (its own start, ~0.1 of a worker's
in a real deployment, is what it is here). Critical paths: waves, encoder + language worker + router
(the router's own start as measured in that run); overlap, max(encoder, language worker) + router:
encoders start with their language workers, the router still after its workers (a router started
with them registers them late: sglang-router retries a worker 1, 2, 3, 4, 5, 5 s apart while it is
not up). Bring-up: from the first spawn (state.json) to `up -d` returning ready,
which now means wired. Figures, not asserts: a loaded machine moves them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPOLOGIES = {
    "EPD": REPO / "topologies" / "epd-b300.yaml",
    "PD": REPO / "topologies" / "pd-b300-low-latency.yaml",
}
ENCODER, LANGUAGE = 1.0, 5.0


def bring_up(home: Path, topology: Path, start: str, scale: float) -> tuple[float, float, str]:
    """(seconds from first spawn to `up -d` ready, the router's own start in that run, when each role started
    and was ready)."""
    sets = [f"start={start}", f"rehearse={{ready_after: {LANGUAGE * scale:g}}}"]
    if "epd" in topology.name:
        sets.append(f"roles.encoder.rehearse={{ready_after: {ENCODER * scale:g}}}")
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    up = subprocess.run(
        [
            sys.executable,
            "-m",
            "muse_launch",
            "up",
            str(topology),
            "--rehearse",
            "-d",
            *[x for s in sets for x in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    returned = time.time()
    if up.returncode != 0:
        sys.exit(f"up {topology.name} ({start}) failed:\n{up.stdout}{up.stderr}")
    name = topology.stem
    roles = json.loads((home / name / "state.json").read_text())["roles"]
    stamp = lambda iso: datetime.fromisoformat(iso).timestamp()  # noqa: E731
    first = min(stamp(r["started_at"]) for r in roles)
    router = next(r for r in roles if r["kind"] == "router")
    subprocess.run(
        [sys.executable, "-m", "muse_launch", "down", name], capture_output=True, env=env, cwd=REPO
    )
    timeline = ", ".join(
        f"{r['name']} {stamp(r['started_at']) - first:.1f}-{stamp(r['ready_at']) - first:.1f}" for r in roles
    )
    return returned - first, stamp(router["ready_at"]) - stamp(router["started_at"]), timeline


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="seconds per unit of start-up delay")
    scale = parser.parse_args().scale
    encoder, language = ENCODER * scale, LANGUAGE * scale
    rows = []
    timelines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        for label, topology in TOPOLOGIES.items():
            epd = label == "EPD"
            waves, router_start, waves_timeline = bring_up(home, topology, "waves", scale)
            overlap, _, overlap_timeline = bring_up(home, topology, "overlap", scale)
            timelines.append(f"{label} waves:   {waves_timeline}, wired {waves:.1f}")
            timelines.append(f"{label} overlap: {overlap_timeline}, wired {overlap:.1f}")
            waves_path = (encoder if epd else 0.0) + language + router_start
            overlap_path = max(encoder if epd else 0.0, language) + router_start
            rows.append((label, waves, waves_path, overlap, overlap_path))
    print(
        f"start-up delays: encoder {encoder:g}s, language workers {language:g}s, router: the real "
        "sglang-router"
    )
    print(
        f"{'':4} {'waves':>7} {'its path':>9} {'ratio':>6}   {'overlap':>7} {'its path':>9} {'ratio':>6}   "
        f"overlap/waves"
    )
    for label, waves, waves_path, overlap, overlap_path in rows:
        print(
            f"{label:4} {waves:6.2f}s {waves_path:8.2f}s {waves / waves_path:6.2f}   {overlap:6.2f}s "
            f"{overlap_path:8.2f}s {overlap / overlap_path:6.2f}   {overlap / waves:6.2f}"
        )
    print("each role started-ready, seconds from the first spawn:")
    for line in timelines:
        print("  " + line)


if __name__ == "__main__":
    main()
