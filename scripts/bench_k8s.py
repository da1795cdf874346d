#!/usr/bin/env python3
"""Kubernetes against one host, side by side: `up --rehearse -d` to ready and `down` of the same files, on
this
host and `--on k8s` (LWS and RBG) on the local control plane (scripts/k8s_local.sh), which it starts
(prepared:
`scripts/k8s_local.sh prepare` first) and stops, timing both. Ratios, not absolute numbers: the machine's load
moves both sides alike. Run it as root in a network namespace of its own:

    unshare -n sh -c 'ip link set lo up && .venv/bin/python scripts/bench_k8s.py --runs 2'

`--changes` times a live change instead, on one host and on both flavours, under the live-change tests' steady
load (4 streaming chats through the router): the seconds from `scale decode 2` to the first token the new
instance generates, and `scale decode 1`'s drain wait beside the longest request the load saw; then the
seconds of `up` of the file edited (prefill's and decode's mem_fraction), relaunched instance by instance.
`--cluster DIR` uses a control plane already started by `scripts/k8s_local.sh start DIR` in this namespace.
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
    ap.add_argument("--changes", action="store_true", help="time scale up and down under load instead")
    ap.add_argument("--cluster", type=Path, help="a control plane already started in this namespace")
    ap.add_argument("--sides", default="one host,k8s lws,k8s rbg", help="--changes: where, comma-separated")
    ap.add_argument("files", nargs="*", default=FILES)
    a = ap.parse_args()
    if a.changes:
        return changes(a)
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


LIVE = {
    "version": 1,
    "name": "bench-live",
    "hardware": "cpu",
    "model": "Qwen/Qwen3-0.6B",
    "engine": "sglang",
    "host": "127.0.0.1",
    "rehearse": {"ready_after": 0.5, "itl_ms": 25},
    "roles": {
        "prefill": {"kind": "prefill", "port": 31001, "bootstrap_port": 31002},
        "decode": {"kind": "decode", "port": 31003},
        "router": {"kind": "router", "port": 8100, "prefill": ["prefill"], "decode": ["decode"]},
    },
}


def generated(url: str) -> float:
    import httpx

    try:
        text = httpx.get(f"{url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(x.split()[-1]) for x in text.splitlines() if x.startswith("sglang:generation_tokens_total")
    )


def one_change(side: list[str], env: dict[str, str], path: Path) -> tuple[float, float, float, float]:
    """(seconds from `scale decode 2` to the new instance's first token, drain wait, longest request, seconds
    of `up` of the file edited)."""
    import json
    import re
    import threading

    sys.path.insert(0, str(REPO / "tests" / "stand_ins"))
    from steady_load import SteadyLoad

    image = ["--image", "example.org/muse:1"] if side else []  # a rehearsal runs no image; k8s wants one
    timed(muse("up", str(path), "--rehearse", "-d", *side, *image), env, "up")
    try:
        roles = json.loads(
            subprocess.run(
                muse("status", "bench-live", "--json"), capture_output=True, text=True, env=env, cwd=REPO
            ).stdout
        )["roles"]
        router = next(r for r in roles if r["name"] == "router")
        host = router.get("ip") or "127.0.0.1"
        with SteadyLoad(f"http://{host}:8100", LIVE["model"]) as load:
            load.wait_for(4)
            first: list[float] = []
            t0 = time.monotonic()

            def watch() -> None:
                while time.monotonic() - t0 < 600 and not first:
                    now = json.loads(
                        subprocess.run(
                            muse("status", "bench-live", "--json"),
                            capture_output=True,
                            text=True,
                            env=env,
                            cwd=REPO,
                        ).stdout
                        or "{}"
                    )
                    new = next((r for r in now.get("roles", []) if r["name"] == "decode-1"), None)
                    url = (
                        f"http://{new.get('ip') or '127.0.0.1'}:{31003 if new.get('ip') else 31004}"
                        if new
                        else ""
                    )
                    if url and generated(url) > 0:
                        first.append(time.monotonic() - t0)
                    time.sleep(0.1)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            timed(muse("scale", "bench-live", "decode", "2"), env, "scale decode 2")
            watcher.join(600)
            load.wait_for(8)
            done = subprocess.run(
                muse("scale", "bench-live", "decode", "1"), capture_output=True, text=True, env=env, cwd=REPO
            )
            load.wait_for(4)
            edited = path.parent / "edited" / path.name
            edited.parent.mkdir(exist_ok=True)
            data = json.loads(path.read_text())
            for role in ("prefill", "decode"):
                data["roles"][role]["mem_fraction"] = 0.71
            edited.write_text(json.dumps(data))
            edit = muse("up", str(edited), "--rehearse", *side, *image)
            relaunch = timed(edit, env, "up of the edited file")
            load.wait_for(4)
        drained = re.search(r"decode-1: drained in ([0-9.]+)s", done.stdout)
        assert load.failures == [], load.failures
        return (
            first[0] if first else float("nan"),
            float(drained[1]) if drained else float("nan"),
            load.longest_s,
            relaunch,
        )
    finally:
        timed(muse("down", "bench-live"), env, "down")


def changes(a: argparse.Namespace) -> int:
    import json

    work = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    path = work / "bench-live.yaml"
    path.write_text(json.dumps(LIVE))
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(work / "home")}
    cluster = a.cluster or work / "cluster"
    if a.cluster is None:
        timed(["bash", "scripts/k8s_local.sh", "start", str(cluster)], env, "k8s_local.sh start")
    env["KUBECONFIG"] = str(cluster / "kubeconfig")
    rows = []
    try:
        sides = {
            "one host": [],
            "k8s lws": ["--on", "k8s", "--to", "lws"],
            "k8s rbg": ["--on", "k8s", "--to", "rbg"],
        }
        for side, extra in sides.items():
            if side not in a.sides.split(","):
                continue
            runs = [one_change(extra, env, path) for _ in range(a.runs)]
            rows.append((side, *(statistics.median(r[i] for r in runs) for i in range(4))))
    finally:
        if a.cluster is None:
            timed(["bash", "scripts/k8s_local.sh", "stop", str(cluster)], env, "k8s_local.sh stop")
    print(
        "scale decode 1 -> 2 -> 1, then up of the file edited (prefill and decode relaunched), under 4 "
        f"streaming chats; medians of {a.runs} runs; 0 failed requests"
    )
    heads = f"{'scale to first token':>21} {'drain wait':>11} {'longest request':>16} {'edited up':>10}"
    print(f"{'where':<9} {heads}")
    for side, first, drain, longest, relaunch in rows:
        print(f"{side:<9} {first:20.2f}s {drain:10.2f}s {longest:15.2f}s {relaunch:9.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
