"""What `bench` and `sweep` cost themselves, side by side.

    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python scripts/bench_bench.py'

1. The load generator's CPU: one point of 16 requests and one of 128 (concurrency 8) against an aggregated
   rehearsal behind sglang-router; aiperf's CPU (all its processes) for each, its fixed cost (start-up) and
   its marginal CPU per request, against the machine's cores.
2. A sweep of three variants (rehearse.itl_ms=1,2,4; one point of 16 requests each) against the sum of its
   parts (each combination's up, bench and down), from sweep.json.

Figures, not asserts: a loaded machine moves them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"


def free_ports(n: int) -> list[int]:
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def topology(path: Path) -> Path:
    worker, router, metrics = free_ports(3)
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "bench-cost",
                "hardware": "b300",
                "model": M,
                "rehearse": {"ready_after": 0.3},
                "roles": {
                    "worker": {"kind": "worker", "gpus": "0-7", "tp": 8, "port": worker},
                    "router": {
                        "kind": "router",
                        "port": router,
                        "metrics_port": metrics,
                        "workers": ["worker"],
                    },
                },
            }
        )
    )
    return path


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="bench-cost-"))
    env = {**os.environ, "MUSE_LAUNCH_HOME": str(tmp / "home")}
    cli = [sys.executable, "-m", "muse_launch"]
    path = topology(tmp / "agg.yaml")
    point = ["--concurrency", "8", "--isl", "128", "--osl", "32", "--duration", "120"]
    subprocess.run([*cli, "up", str(path), "-d", "--rehearse"], env=env, check=True, capture_output=True)
    client = {}
    try:
        for n in (16, 128):
            out = tmp / f"n{n}"
            subprocess.run(
                [*cli, "bench", "bench-cost", *point, "--requests", str(n), "--out", str(out)],
                env=env,
                capture_output=True,
            )
            p = json.loads((out / "summary.json").read_text())["points"][0]
            client[n] = p
    finally:
        subprocess.run([*cli, "down", "bench-cost"], env=env, capture_output=True)
    a, b = client[16], client[128]
    marginal = 1000 * (b["client"]["cpu_s"] - a["client"]["cpu_s"]) / (b["requests_ok"] - a["requests_ok"])
    fixed = a["client"]["cpu_s"] - marginal * a["requests_ok"] / 1000
    print(
        f"load generator (aiperf 0.13.0), {os.cpu_count()} cores, concurrency 8, ISL 128, OSL 32, rehearsal:"
    )
    print(
        f"{'requests':>9} {'wall s':>7} {'aiperf CPU s':>12} {'CPU ms/request':>14} {'host busy %':>11} "
        f"{'out tok/s':>9}"
    )
    for n, p in client.items():
        c = p["client"]
        print(
            f"{n:>9} {c['wall_s']:>7.1f} {c['cpu_s']:>12.2f} {c['cpu_ms_per_request']:>14.1f} "
            f"{c['host_cpu_busy_pct']:>11.0f} {p['output_tokens_per_s']:>9.1f}"
        )
    print(f"fixed (start-up) {fixed:.2f} CPU s per point; marginal {marginal:.1f} CPU ms per request")

    sweep = tmp / "sweep"
    subprocess.run(
        [
            *cli,
            "sweep",
            str(path),
            "--rehearse",
            "--vary",
            "rehearse.itl_ms=1,2,4",
            "--concurrency",
            "4",
            "--isl",
            "64",
            "--osl",
            "16",
            "--requests",
            "16",
            "--out",
            str(sweep),
        ],
        env=env,
        capture_output=True,
    )
    s = json.loads((sweep / "sweep.json").read_text())
    print(
        f"\nsweep of {len(s['results'])} variants: {s['wall_s']:.1f} s in all, {s['sum_of_parts_s']:.1f} s "
        f"the sum of its parts ({s['wall_s'] / s['sum_of_parts_s']:.3f} x)"
    )
    print(f"{'variant':<22} {'up s':>6} {'bench s':>8} {'down s':>7}  state")
    for r in s["results"]:
        print(
            f"{' '.join(r['combination']):<22} {r.get('up_s', 0):>6.1f} {r.get('bench_s', 0):>8.1f} "
            f"{r.get('down_s', 0):>7.1f}  {r['state']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
