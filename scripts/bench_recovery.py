"""How soon requests through the real router work again after a worker crashes and is restarted.

A PD pair of simulated engines behind the real sglang-router, in rehearsal. The decode is
SIGKILLed; the supervisor restarts it on the same port; we time from its being ready again
(its /health answering 200) to the first chat completion sent after that which succeeds,
while four clients keep sending through the outage.
Side by side in one run: with muse-launch's router settings, and with the router's own
defaults (health checks every 60 s, circuit breaker open for 60 s).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

TOPOLOGY = """
version: 1
name: {name}
hardware: cpu
model: bench/model
rehearse: {{ready_after: 0.5}}
roles:
  prefill: {{kind: prefill, port: 21101, bootstrap_port: 21198, transfer_backend: mooncake}}
  decode:  {{kind: decode, port: 21102, transfer_backend: mooncake, rehearse: {{ready_after: 3}}}}
  router:
    kind: router
    port: 21100
    metrics_port: 21199
    prefill: [prefill]
    decode: [decode]
    args: {router_args}
"""
ROUTER_DEFAULTS = ["--health-check-interval-secs", "60", "--cb-timeout-duration-secs", "60"]
GIVE_UP = 45.0
CLIENTS = 4  # concurrent clients keep sending through the outage, as real traffic would


def cli(home: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "MUSE_LAUNCH_HOME": home},
    )


def chat(client: httpx.Client) -> int:
    try:
        return client.post(
            "http://127.0.0.1:21100/v1/chat/completions",
            json={"model": "bench/model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        ).status_code
    except httpx.HTTPError:
        return 0


def healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(url, timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def measure(label: str, router_args: list[str]) -> float | None:
    """Seconds from the restarted decode answering /health 200 to the first request, sent after
    that moment, that succeeds through the router; None if none did within GIVE_UP."""
    name = f"bench-recovery-{label}"
    with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as d:
        path = Path(d) / "pd.yaml"
        path.write_text(TOPOLOGY.format(name=name, router_args=json.dumps(router_args)))
        up = cli(home, "up", str(path), "--rehearse", "-d")
        if up.returncode != 0:
            sys.exit(f"{label}: up failed:\n{up.stdout}{up.stderr}")
        results: list[tuple[float, float, int]] = []  # (sent, answered, status)
        stop = threading.Event()

        def client_loop() -> None:
            with httpx.Client(timeout=30) as client:
                while not stop.is_set():
                    sent = time.time()
                    code = chat(client)
                    results.append((sent, time.time(), code))
                    time.sleep(0.02)

        try:
            decode = next(
                r
                for r in json.loads(cli(home, "status", name, "--json").stdout)["roles"]
                if r["name"] == "decode"
            )
            threads = [threading.Thread(target=client_loop, daemon=True) for _ in range(CLIENTS)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            os.kill(decode["pid"], signal.SIGKILL)
            with httpx.Client() as probe:
                while healthy(probe, decode["url"] + "/health"):
                    time.sleep(0.01)
                while not healthy(probe, decode["url"] + "/health"):
                    time.sleep(0.02)
            ready = time.time()
            while time.time() - ready < GIVE_UP:
                ok = [answered for sent, answered, code in list(results) if sent >= ready and code == 200]
                if ok:
                    return min(ok) - ready
                time.sleep(0.05)
            return None
        finally:
            stop.set()
            cli(home, "down", name)


def main() -> None:
    ours = measure("muse", [])
    theirs = measure("router-defaults", ROUTER_DEFAULTS)
    show = lambda t: f"{t:6.2f} s" if t is not None else f"  > {GIVE_UP:.0f} s"  # noqa: E731
    print("requests work again after the restarted decode is ready:")
    print(f"  muse-launch router settings:  {show(ours)}")
    print(f"  router defaults (60 s / 60 s): {show(theirs)}")
    if ours is not None:
        print(
            f"  ratio defaults / muse-launch: {'> ' if theirs is None else ''}"
            f"{(theirs or GIVE_UP) / max(ours, 1e-3):.0f}x"
        )


if __name__ == "__main__":
    main()
