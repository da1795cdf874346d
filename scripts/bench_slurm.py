"""`up --on slurm --rehearse` against the same topology's single-host rehearsal, side by side.

    unshare -n sh -c 'ip link set lo up; .venv/bin/python scripts/bench_slurm.py [FILE] [--runs N]'

Starts a local SLURM cluster (scripts/slurm_local.sh, in a temporary directory; stopped at the
end), then for each run: the single-host rehearsal (`up --rehearse -d`, `down`) and the SLURM
one (`up --on slurm --rehearse -d`, `down`). Prints medians: time to ready as the user sees it
(the `up` command's wall time), for SLURM also submission to the batch supervisor's start and
submission to the first role's step, and `down`. Figures, not asserts; run it in a network
namespace of its own (above) so the topology's fixed ports are free.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
READY_AFTER = "rehearse={ready_after: 0.3}"


def cli(home: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "muse_launch", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        sys.exit(f"`muse-launch {' '.join(args)}` failed:\n{done.stdout}{done.stderr}")
    return time.monotonic() - started, done


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def one_run(path: Path, name: str, home: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    out["single: up to ready"], _ = cli(
        home / "single", "up", str(path), "--rehearse", "-d", "--set", READY_AFTER
    )
    out["single: down"], _ = cli(home / "single", "down", name)
    out["slurm: up to ready"], _ = cli(
        home / "slurm", "up", str(path), "--on", "slurm", "--rehearse", "-d", "--set", READY_AFTER
    )
    run_dir = home / "slurm" / name
    job = json.loads((run_dir / "slurm" / "job.json").read_text())
    placed = json.loads((run_dir / "slurm" / "placement.json").read_text())
    state = json.loads((run_dir / "state.json").read_text())
    first_step = min(epoch(r["started_at"]) for r in state["roles"] if r.get("started_at"))
    out["slurm: submit -> batch supervisor"] = placed["started_at"] - job["submitted_at"]
    out["slurm: submit -> first step"] = first_step - job["submitted_at"]
    out["slurm: down"], _ = cli(home / "slurm", "down", name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("file", nargs="?", default=str(REPO / "topologies" / "helion-gb300.yaml"))
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    path = Path(args.file).resolve()
    name = yaml.safe_load(path.read_text())["name"]
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        cluster = Path(tmp) / "c"
        start = subprocess.run(
            ["bash", str(REPO / "scripts" / "slurm_local.sh"), "start", str(cluster)],
            capture_output=True,
            text=True,
        )
        if start.returncode != 0:
            sys.exit(f"slurm_local.sh start failed:\n{start.stderr}")
        os.environ["SLURM_CONF"] = str(cluster / "slurm.conf")
        try:
            runs = [one_run(path, name, Path(tmp) / f"run{i}") for i in range(args.runs)]
        finally:
            subprocess.run(
                ["bash", str(REPO / "scripts" / "slurm_local.sh"), "stop", str(cluster)], capture_output=True
            )
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{name}: {args.runs} runs each, medians (local SLURM cluster of 3 fake nodes, rehearsal engines)")
    print(f"  {'':28} {'single host':>12} {'slurm':>10}")
    print(
        f"  {'up -d to ready':28} {median['single: up to ready']:>11.2f}s "
        f"{median['slurm: up to ready']:>9.2f}s"
    )
    print(
        f"  {'submit -> batch supervisor':28} {'-':>12} {median['slurm: submit -> batch supervisor']:>9.2f}s"
    )
    print(f"  {'submit -> first step':28} {'-':>12} {median['slurm: submit -> first step']:>9.2f}s")
    print(f"  {'down':28} {median['single: down']:>11.2f}s {median['slurm: down']:>9.2f}s")


if __name__ == "__main__":
    main()
