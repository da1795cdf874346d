"""How long `validate` takes on a large topology (goal: well under a second for 256 roles).

Prints, in one run: the in-process time of load + checks + plan for 256 roles, the same for the
4-role cookbook EPD file (their ratio shows how checks scale), and the wall time of the CLI
process (`python -m muse_launch validate`), whose floor is the interpreter's start-up.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from muse_launch.core import check_file

ROOT = Path(__file__).resolve().parent.parent


def big_topology(workers: int = 255) -> dict:
    """Prefill/decode workers of 4 GPUs (TP4/EP4), two per 8-GPU node over 128 nodes, behind one router."""
    nodes = {f"n{i}": {"address": f"10.0.{i // 250}.{i % 250 + 1}"} for i in range(128)}
    roles: dict = {}
    for i in range(workers):
        node = f"n{i // 2}"
        kind = "prefill" if i % 2 == 0 else "decode"
        gpus = [0, 1, 2, 3] if i % 2 == 0 else [4, 5, 6, 7]
        roles[f"w{i}"] = {
            "kind": kind,
            "gpus": gpus,
            "port": 30000 + i,
            "tp": 4,
            "ep": 4,
            "nodes": [node],
            "transfer_backend": "mooncake",
            "bootstrap_port": 9000 + i,
            "args": ["--reasoning-parser", "muse"],
        }
    roles["router"] = {
        "kind": "router",
        "port": 8000,
        "host": "10.0.0.1",
        "prefill": [n for n, r in roles.items() if r["kind"] == "prefill"],
        "decode": [n for n, r in roles.items() if r["kind"] == "decode"],
    }
    return {
        "version": 1,
        "name": "big",
        "hardware": "b300",
        "host": "10.0.0.1",
        "model": "meta-models/Muse-Spark-Open-816B-A42B-NVFP4",
        "nodes": nodes,
        "roles": roles,
    }


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.yaml"
        big.write_text(yaml.safe_dump(big_topology(), sort_keys=False))
        epd = ROOT / "topologies" / "epd-b300.yaml"
        _, findings, plan = check_file(big)
        assert plan is not None, [f.message for f in findings][:5]
        roles = len(plan.specs)
        t_big = timed(lambda: check_file(big), 5)
        t_epd = timed(lambda: check_file(epd), 20)
        cli = [sys.executable, "-m", "muse_launch", "validate", str(big)]
        t_cli = timed(lambda: subprocess.run(cli, capture_output=True, check=False), 3)
        t_py = timed(lambda: subprocess.run([sys.executable, "-c", "import muse_launch.cli"], check=True), 3)
    print(f"validate, in process, {roles} roles:   {t_big * 1000:8.1f} ms  (findings: {len(findings)})")
    print(f"validate, in process, 4 roles (EPD): {t_epd * 1000:8.1f} ms")
    print(f"per-role cost ratio 256-role / EPD:  {(t_big / roles) / (t_epd / 4):8.2f}x")
    print(f"CLI wall time, {roles} roles:          {t_cli * 1000:8.1f} ms")
    print(f"of which importing the CLI:          {t_py * 1000:8.1f} ms  ({t_py / t_cli:.0%})")


if __name__ == "__main__":
    main()
