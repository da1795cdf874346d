#!/usr/bin/env python3
"""How long `scale` takes to put a new worker to work, and how long a drain waits, side by side with what
bounds them: a rehearsal (the simulated engine behind the real sglang-router) under a steady load of
streaming chats through the router (tests/stand_ins/steady_load.py), scaled decode 1 -> 2 -> 1 per round.

- up: the time from `scale` to the new worker's first request (its own token counter moves), against
  that worker's own ready time (started -> ready, from `status`). The difference is what muse-launch adds:
  the pre-flight, the readiness polling, the router's registration and its health check.
- down: the drain wait (`scale` says it), against the longest request of the load: a drain waits for the
  requests in flight on the worker, so it is bounded by the longest one, plus the router's settle time.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python scripts/bench_scale.py --rounds 3'
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "stand_ins"))
from steady_load import SteadyLoad  # noqa: E402

from muse_launch.engines.metrics import SGLANG  # noqa: E402

MODEL = "Qwen/Qwen3-0.6B"


def free_ports(n: int) -> list[int]:
    sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def cli(env: dict, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "muse_launch", *args], env=env, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        raise SystemExit(f"muse-launch {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def generated(url: str) -> float:
    try:
        text = httpx.get(f"{url}/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith(SGLANG.generation_tokens)
    )


def seconds(start: str, end: str) -> float:
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def one_round(
    env: dict, name: str, router: str, new_url: str, load: SteadyLoad
) -> tuple[float, float, float, int]:
    began = time.monotonic()
    scaler = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "scale", name, "decode", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    while generated(new_url) == 0:
        if time.monotonic() - began > 300:
            raise SystemExit("the new worker took no request in 300 s")
        time.sleep(0.02)
    first = time.monotonic() - began
    out = scaler.communicate(timeout=300)[0]
    if scaler.returncode != 0:
        raise SystemExit(out)
    role = next(r for r in json.loads(cli(env, "status", name, "--json"))["roles"] if r["name"] == "decode-1")
    state = json.loads((Path(env["MUSE_LAUNCH_HOME"]) / name / "state.json").read_text())
    started = next(r for r in state["roles"] if r["name"] == "decode-1")["started_at"]
    own_ready = seconds(started, role["ready_at"])
    load.wait_for(8)
    out = cli(env, "scale", name, "decode", "1")
    m = re.search(r"drained in ([0-9.]+)s \((\d+) in flight", out)
    if not m:
        raise SystemExit(f"no drain line in:\n{out}")
    return first, own_ready, float(m[1]), int(m[2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--itl-ms", type=float, default=40.0, help="the simulated engine's time per token")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per chat of the load")
    parser.add_argument("--ready-after", type=float, default=2.0, help="the simulated engine's start-up time")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**os.environ, "MUSE_LAUNCH_HOME": str(home), "HF_HUB_OFFLINE": "1"}
        prefill, decode, router, boot, metrics = free_ports(5)
        name = "bench-scale"
        topology = {
            "version": 1,
            "name": name,
            "hardware": "cpu",
            "engine": "sglang",
            "model": MODEL,
            "rehearse": {"ready_after": ns.ready_after, "itl_ms": ns.itl_ms},
            "roles": {
                "prefill": {"kind": "prefill", "port": prefill, "bootstrap_port": boot},
                "decode": {"kind": "decode", "port": decode},
                "router": {
                    "kind": "router",
                    "port": router,
                    "metrics_port": metrics,
                    "prefill": ["prefill"],
                    "decode": ["decode"],
                },
            },
        }
        path = Path(tmp) / f"{name}.yaml"
        path.write_text(yaml.safe_dump(topology))
        cli(env, "up", str(path), "--rehearse", "-d")
        rows = []
        try:
            with SteadyLoad(f"http://127.0.0.1:{router}", MODEL, max_tokens=ns.max_tokens) as load:
                load.wait_for(8)
                for _ in range(ns.rounds):
                    rows.append(one_round(env, name, router, f"http://127.0.0.1:{decode + 1}", load))
                    load.wait_for(4)
            longest = load.longest_s
            failed = len(load.failures)
            ok = load.ok
        finally:
            cli(env, "down", name)
    print(
        f"simulated engine: {ns.itl_ms:g} ms/token, {ns.max_tokens} tokens a chat, "
        f"ready after {ns.ready_after:g}s; load: 4 concurrent streaming chats, {ok} ok, {failed} failed; "
        f"longest request {longest:.2f}s"
    )
    print(
        f"{'round':>5}  {'scale->1st request':>18}  {'worker ready':>12}  {'ratio':>6}  "
        f"{'drain wait':>10}  {'in flight':>9}  {'longest req':>11}  {'ratio':>6}"
    )
    for i, (first, ready, drain, flight) in enumerate(rows, 1):
        print(
            f"{i:>5}  {first:>17.2f}s  {ready:>11.2f}s  {first / ready:>6.2f}  "
            f"{drain:>9.2f}s  {flight:>9}  {longest:>10.2f}s  {drain / longest:>6.2f}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
