#!/usr/bin/env python3
"""Kubernetes against one host, side by side: `up --rehearse -d` to ready and `down` of the same files, on
this
host and `--on k8s` (LWS and RBG) on the local control plane (scripts/k8s_local.sh), which it starts
(prepared:
`scripts/k8s_local.sh prepare` first) and stops, timing both. Ratios, not absolute numbers: the machine's load
moves both sides alike. Run it as root in a network namespace of its own:

    unshare -n sh -c 'ip link set lo up && .venv/bin/python scripts/bench_k8s.py --runs 2'
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ["topologies/epd-b300.yaml", "topologies/h200-bf16-2node.yaml"]


def timed(argv: list[str], env: dict[str, str], what: str) -> float:
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        sys.exit(
            f"bench_k8s: {what} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return seconds


def muse(*args: str) -> list[str]:
    return [sys.executable, "-m", "muse_launch", *args]


def name_of(path: str) -> str:
    import yaml

    return yaml.safe_load((REPO / path).read_text())["name"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("files", nargs="*", default=FILES)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    cluster = work / "cluster"
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(work / "home")}
    start = timed(["bash", "scripts/k8s_local.sh", "start", str(cluster)], env, "k8s_local.sh start")
    env["KUBECONFIG"] = str(cluster / "kubeconfig")
    rows = []
    try:
        for path in a.files:
            name = name_of(path)
            sides = {
                "one host": [],
                "k8s lws": ["--on", "k8s", "--to", "lws"],
                "k8s rbg": ["--on", "k8s", "--to", "rbg"],
            }
            for side, extra in sides.items():
                ups, downs = [], []
                for _ in range(a.runs):
                    ups.append(timed(muse("up", path, "--rehearse", "-d", *extra), env, f"up {path} {side}"))
                    downs.append(timed(muse("down", name), env, f"down {name} {side}"))
                rows.append((path, side, statistics.median(ups), statistics.median(downs)))
    finally:
        stop = timed(["bash", "scripts/k8s_local.sh", "stop", str(cluster)], env, "k8s_local.sh stop")
    print(
        f"control plane (prepared) start {start:.1f}s, stop {stop:.1f}s; medians of {a.runs} runs, wall time "
        "of "
        f"the command"
    )
    print(f"{'file':<36} {'where':<9} {'up -d':>7} {'down':>6} {'up vs one host':>15}")
    base: dict[str, float] = {}
    for path, side, up, down in rows:
        base.setdefault(path, up)
        print(f"{path:<36} {side:<9} {up:6.2f}s {down:5.2f}s {up / base[path]:14.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
