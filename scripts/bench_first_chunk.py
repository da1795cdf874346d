"""Where the ~40 ms on the first streamed token of a reused connection comes from: the engine, or the router.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python scripts/bench_first_chunk.py'

Brings up a rehearsal (the simulated engine behind each real router, in turn), then streams the same chat
request directly to the engine and through the router, on a fresh connection each time and on one kept-alive
connection, and prints side by side the median time to the first content chunk and the longest gap between
chunks. With strace on the host it also prints whether each side sets TCP_NODELAY on the sockets it accepts.

What it showed (2 loaded cores): the simulated engine (asyncio: TCP_NODELAY on every socket) answers in a few
ms
either way; sglang-router 0.3.2 and smg 1.13.0 accept client connections without TCP_NODELAY (47 and 50 ms
reused against 7 and 6 ms fresh; vllm-router 0.1.17 sets it: 7 ms), so on a reused connection its
second write (the first token, after the role chunk) waits for the client's delayed ACK: ~40 ms (Nagle's
algorithm against Linux's 40 ms delayed-ACK minimum). A fresh connection starts in quick-ACK mode, hence 10-16
ms.
The hold is the router's, not muse-launch's: bench reports what a client of that router sees.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
ROUTERS = ("sglang-router", "smg", "vllm-router")
N = 15
BODY = {
    "messages": [{"role": "user", "content": "the king and the queen"}],
    "max_tokens": 16,
    "ignore_eos": True,
    "stream": True,
}


def topology(router: str) -> dict:
    engine = "vllm" if router == "vllm-router" else "sglang"
    return {
        "version": 1,
        "name": f"first-chunk-{router}",
        "hardware": "b300",
        "engine": engine,
        "model": "meta-models/Muse-Spark-Open-816B-A42B-NVFP4",
        "rehearse": {"ready_after": 0.3},
        "roles": {
            "worker": {"kind": "worker", "gpus": "0-7", "tp": 8, "port": 31901},
            "router": {
                "kind": "router",
                "engine": router,
                "port": 31900,
                "metrics_port": 31902,
                "workers": ["worker"],
            },
        },
    }


def stream_once(client: httpx.Client, base: str, model: str) -> tuple[float, float]:
    """(ms to the first content chunk, longest ms between chunks)."""
    start = time.perf_counter()
    first, last, gap = None, None, 0.0
    with client.stream("POST", base + "/v1/chat/completions", json={**BODY, "model": model}) as r:
        for line in r.iter_lines():
            now = time.perf_counter()
            if not line.startswith("data:") or "[DONE]" in line:
                continue
            delta = (json.loads(line[5:]).get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                first = first if first is not None else now - start
                gap = max(gap, now - last) if last is not None else gap
                last = now
    return 1000 * (first or 0.0), 1000 * gap


def measure(base: str, model: str) -> dict:
    fresh = []
    for _ in range(N):
        with httpx.Client(timeout=30) as c:
            fresh.append(stream_once(c, base, model))
    with httpx.Client(timeout=30) as c:
        reused = [stream_once(c, base, model) for _ in range(N)]
    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
    return {
        "fresh_ttft": med(fresh, 0),
        "reused_ttft": med(reused, 0),
        "fresh_gap": med(fresh, 1),
        "reused_gap": med(reused, 1),
    }


def nodelay(pid: int, base: str, model: str) -> str:
    """Whether `pid` sets TCP_NODELAY on a connection it accepts (strace), or '?'."""
    if not shutil.which("strace"):
        return "?"
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        tracer = subprocess.Popen(
            ["strace", "-f", "-p", str(pid), "-e", "trace=setsockopt", "-o", out.name],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)
        with httpx.Client(timeout=30) as c:
            stream_once(c, base, model)
        time.sleep(0.3)
        tracer.terminate()
        tracer.wait()
        return "yes" if "TCP_NODELAY" in Path(out.name).read_text() else "no"


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="first-chunk-"))
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(home)}
    cli = [sys.executable, "-m", "muse_launch"]
    print(
        f"{'path':<28} {'TTFT fresh':>10} {'TTFT reused':>11} {'gap fresh':>9} {'gap reused':>10}  "
        "TCP_NODELAY"
    )
    for router in ROUTERS:
        path = home / f"{router}.yaml"
        path.write_text(yaml.safe_dump(topology(router)))
        name = topology(router)["name"]
        if subprocess.run(
            [*cli, "up", str(path), "-d", "--rehearse"], env=env, capture_output=True
        ).returncode:
            print(f"{router}: up failed; skipped")
            continue
        try:
            state = json.loads((home / name / "state.json").read_text())
            pids = {r["name"]: r["pid"] for r in state["roles"]}
            model = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
            for label, base, pid in (
                ("engine direct", "http://127.0.0.1:31901", pids["worker"]),
                (f"through {router}", "http://127.0.0.1:31900", pids["router"]),
            ):
                m = measure(base, model)
                print(
                    f"{label:<28} {m['fresh_ttft']:>8.1f}ms {m['reused_ttft']:>9.1f}ms "
                    f"{m['fresh_gap']:>7.1f}ms "
                    f"{m['reused_gap']:>8.1f}ms  {nodelay(pid, base, model)}"
                )
        finally:
            subprocess.run([*cli, "down", name], env=env, capture_output=True)
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
