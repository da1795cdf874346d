"""What a worker's or the router's death or hang costs, per router, under a steady load.

A rehearsal (simulated engines, the real router): one prefill, two decodes, 8 streaming chats in a closed
loop (~0.7 s a request: 24 tokens at 25 ms). For each router and each case (SIGKILL, or SIGSTOP for 20 s
then SIGCONT, of a prefill, a decode, the router), one row:

  failed      requests that failed during the event
  held        of those, the ones that began before the faulty process was out of the router (for the
              router itself: every one); a request that began later and failed is a sibling's failure
  in_flight   requests the router counted on the faulty worker just before the fault
  out_s       seconds from the fault until the router stopped listing it healthy (the supervisor removing
              it, or the router's own health check); for the router: until it answers again
  back_s      seconds until capacity is back: the worker listed again and generating, the router serving
  ttft_p99    p99 time to first token of requests begun during the event, against the steady state before

Run in a network namespace (its ports are its own):

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python scripts/bench_failover.py'
    ... scripts/bench_failover.py --routers sglang-router --cases decode:SIGSTOP
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "stand_ins"))
from steady_load import SteadyLoad  # noqa: E402

from muse_launch.engines.router import REMOVAL_SETTLE_S  # noqa: E402

MODEL = "bench/model"
CLIENTS = 8
HANG_S = 20.0
STEADY_S = 8.0
CASES = [f"{t}:{f}" for t in ("decode", "prefill", "router") for f in ("SIGKILL", "SIGSTOP")]
ROUTERS = ("sglang-router", "smg", "vllm-router")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def topology(router: str, ports: list[int]) -> str:
    prefill, decode, port, boot, metrics, side_p, side_d = ports
    engine = "vllm" if router == "vllm-router" else "sglang"
    side = (
        (f", side_channel_port: {side_p}", f", side_channel_port: {side_d}")
        if engine == "vllm"
        else (f", bootstrap_port: {boot}", "")
    )
    probe = "ready: {http: /health, interval: 0.1, timeout: 120}"
    return f"""
version: 1
name: failover
hardware: cpu
engine: {engine}
model: {MODEL}
rehearse: {{ready_after: 0.5, itl_ms: 25}}
roles:
  prefill: {{kind: prefill, port: {prefill}{side[0]}, {probe}}}
  decode: {{kind: decode, port: {decode}, replicas: 2{side[1]}, {probe}}}
  router:
    kind: router
    engine: {router}
    port: {port}
    metrics_port: {metrics}
    prefill: [prefill]
    decode: [decode]
"""


class Deployment:
    def __init__(self, home: str):
        self.env = {**os.environ, "MUSE_LAUNCH_HOME": home}

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "muse_launch", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def role(self, name: str) -> dict:
        status = json.loads(self.cli("status", "failover", "--json").stdout)
        return next(r for r in status["roles"] if r["name"] == name)


def healthy(router: str, url: str) -> set[str] | None:
    """The URLs the router lists as healthy; vllm-router's list says nothing of health."""
    path = "/list_workers" if router == "vllm-router" else "/workers"
    try:
        answer = httpx.get(url + path, timeout=1).json()
    except (httpx.HTTPError, ValueError):
        return None
    if "urls" in answer:
        return set(answer["urls"])
    return {w["url"] for w in answer["workers"] if w.get("is_healthy", True)}


def in_flight(metrics_url: str, worker: str) -> float | None:
    try:
        text = httpx.get(metrics_url + "/metrics", timeout=1).text
    except httpx.HTTPError:
        return None
    total = None
    for line in text.splitlines():
        if (
            line.startswith(("smg_worker_requests_active", "vllm_router_pd_active_decode_requests"))
            and f'"{worker}"' in line
        ):
            total = (total or 0) + float(line.split()[-1])
    return total


def generated(url: str) -> float:
    try:
        text = httpx.get(url + "/metrics", timeout=1).text
    except httpx.HTTPError:
        return -1.0
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(("sglang:gen", "vllm:gen")))


def p99(values: list[float]) -> float:
    values = sorted(v for v in values if not math.isnan(v))
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


def wait(condition, timeout: float, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval)
    return None


def one_case(d: Deployment, router: str, ports: list[int], case: str) -> dict:
    target, fault = case.split(":")
    router_url, metrics_url = f"http://127.0.0.1:{ports[2]}", f"http://127.0.0.1:{ports[4]}"
    name = {"decode": "decode-1", "prefill": "prefill", "router": "router"}[target]
    url = {"decode": f"http://127.0.0.1:{ports[1] + 1}", "prefill": f"http://127.0.0.1:{ports[0]}"}.get(
        target
    )
    role = d.role(name)
    pid, restarts = role["pid"], role["restarts"]
    with SteadyLoad(router_url, MODEL, concurrency=CLIENTS) as load:
        steady_from = time.monotonic()
        time.sleep(STEADY_S)
        held = in_flight(metrics_url, url) if url else None
        fault_at = time.monotonic()
        os.kill(pid, signal.Signals[fault])
        resumer = None
        if fault == "SIGSTOP":
            resumer = threading.Timer(HANG_S, lambda: _cont(pid))
            resumer.start()
        if url:
            out = wait(lambda: (u := healthy(router, router_url)) is not None and url not in u, 40)
        else:
            out = wait(lambda: healthy(router, router_url) is None, 5) and wait(
                lambda: healthy(router, router_url) is not None, 60
            )
        out_at = time.monotonic() if out else float("nan")

        def back() -> bool:
            if d.role(name)["state"] != "ready":
                return False
            if url is None:
                return True
            if url not in (healthy(router, router_url) or set()):
                return False
            before = generated(url)
            return wait(lambda: generated(url) > before, 5, 0.05) is not None

        came_back = wait(back, 90, 0.1)
        back_at = time.monotonic() if came_back else float("nan")
        if resumer:
            resumer.join()
        time.sleep(3.0)  # what follows the event: a breaker opening late shows here
    event_end = max(back_at if not math.isnan(back_at) else fault_at + 90, fault_at + 1)
    steady = [f - b for b, f, ok in load.ended if steady_from <= b < fault_at and ok]
    during = [f - b for b, f, ok in load.ended if fault_at <= b <= event_end and ok]
    failed = [b for b, _, ok in load.ended if not ok and b >= fault_at - 5]
    cutoff = out_at + REMOVAL_SETTLE_S if url else float("inf")
    return {
        "router": router,
        "case": case,
        "failed": len(failed),
        "held": None if math.isnan(cutoff) else sum(1 for b in failed if b <= cutoff),
        "in_flight": held,
        "out_s": out_at - fault_at,
        "back_s": back_at - fault_at,
        "ttft_p99": p99(during),
        "ttft_p99_steady": p99(steady),
        "restarted": d.role(name)["restarts"] > restarts,
        "failures": load.failures[:3],
        # (began after the fault, time to first token) of each request slower than 1 s to its first token
        "slow": [(round(b - fault_at, 2), round(f - b, 2)) for b, f, ok in load.ended if ok and f - b > 1.0],
    }


def _cont(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # stopped and replaced as hung meanwhile


def settle(d: Deployment, router: str, ports: list[int]) -> None:
    want = {f"http://127.0.0.1:{p}" for p in (ports[0], ports[1], ports[1] + 1)}
    router_url = f"http://127.0.0.1:{ports[2]}"

    def ready() -> bool:
        status = json.loads(d.cli("status", "failover", "--json").stdout)
        return status["state"] == "ready" and want <= (healthy(router, router_url) or set())

    wait(ready, 120, 0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--json", help="write every row to this file too")
    args = parser.parse_args()
    rows = []
    for router in args.routers:
        with tempfile.TemporaryDirectory() as home:
            d, ports = Deployment(home), free_ports(7)
            path = Path(home) / "failover.yaml"
            path.write_text(topology(router, ports))
            up = d.cli("up", str(path), "--rehearse", "-d")
            if up.returncode != 0:
                print(f"{router}: up failed:\n{up.stdout}{up.stderr}", file=sys.stderr)
                continue
            try:
                for case in args.cases:
                    settle(d, router, ports)
                    rows.append(one_case(d, router, ports, case))
                    print(_line(rows[-1]), flush=True)
            finally:
                d.cli("down", "failover")
    print()
    print(_header())
    for row in rows:
        print(_line(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _header() -> str:
    return (
        f"{'router':14} {'case':16} {'failed':>6} {'held':>5} {'in_flt':>6} {'out_s':>6} {'back_s':>6} "
        f"{'ttft_p99':>8} {'steady':>7} restarted"
    )


def _line(r: dict) -> str:
    flight = "-" if r["in_flight"] is None else f"{r['in_flight']:.0f}"
    held = "-" if r["held"] is None else str(r["held"])
    return (
        f"{r['router']:14} {r['case']:16} {r['failed']:6} {held:>5} {flight:>6} {r['out_s']:6.2f} "
        f"{r['back_s']:6.2f} {r['ttft_p99']:8.3f} {r['ttft_p99_steady']:7.3f} {r['restarted']}"
    )


if __name__ == "__main__":
    sys.exit(main())
