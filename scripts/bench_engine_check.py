"""How much time the engine check adds to `up` (goal: under 2 s for topologies/epd-b300.yaml).

`up` starts the parser processes (one per interpreter and engine) before its other checks and
collects them after: what the check adds is the wall time from the start of `up`'s preflight to
the check's result, less the preflight alone (load + checks + plan). Measured for the cookbook EPD
file (3 SGLang roles and sglang-router) and a 32-role file (12 SGLang and 12 vLLM prefill/decode
pairs' roles, 4 aggregated workers, 4 routers of the three kinds): median of --runs runs after
one warm-up run (the first parse after an install also writes Python's bytecode caches), each
"parsed" (every command through the parsers) and "remembered" (a repeated `up` of unchanged
commands on an unchanged install: no parser process). CPU is the child processes' (parsers,
version queries, router --help), per check; on a loaded machine the wall time is mostly waiting.

    .venv/bin/python scripts/bench_engine_check.py [--runs 3]

Needs the parsers that scripts/install_engine_parsers.sh installs: their venv's bin goes first on
PATH here, as an engine host has `sglang` and `vllm`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(
    os.environ.get("MUSE_LAUNCH_PARSERS_VENV") or Path.home() / ".cache/muse-launch/engine-parsers-venv"
)


def topology_32() -> dict:
    """32 roles on one CPU host: 6 SGLang and 6 vLLM prefill/decode pairs, 4 aggregated workers, and
    sglang-router, smg and vllm-router in front of them."""
    roles: dict = {}
    port = 30000
    for engine in ("sglang", "vllm"):
        for i in range(6):
            for kind in ("prefill", "decode"):
                port += 1
                extra = ["--max-model-len", "4096"] if engine == "vllm" else ["--context-length", "4096"]
                role = {
                    "kind": kind,
                    "engine": engine,
                    "port": port,
                    "tp": 1,
                    "args": ["--served-model-name", "m", *extra],
                }
                if engine == "vllm":
                    role["transfer_backend"] = "example"
                elif kind == "prefill":
                    role["bootstrap_port"] = 9000 + i
                roles[f"{engine}-{kind}-{i}"] = role
        for i in range(2):
            port += 1
            roles[f"{engine}-worker-{i}"] = {"kind": "worker", "engine": engine, "port": port}
    fronts = (
        ("r-sglang", "sglang-router", "sglang", range(0, 3)),
        ("r-smg", "smg", "sglang", range(3, 6)),
        ("r-vllm", "vllm-router", "vllm", range(6)),
    )
    for name, router, engine, pairs in fronts:
        port += 1
        roles[name] = {
            "kind": "router",
            "engine": router,
            "port": port,
            "metrics_port": port + 1000,
            "prefill": [f"{engine}-prefill-{i}" for i in pairs],
            "decode": [f"{engine}-decode-{i}" for i in pairs],
        }
    roles["r-workers"] = {
        "kind": "router",
        "engine": "sglang-router",
        "port": port + 1,
        "metrics_port": port + 1001,
        "workers": ["sglang-worker-0", "sglang-worker-1"],
    }
    assert len(roles) == 32
    return {
        "version": 1,
        "name": "engine-check-32",
        "hardware": "cpu",
        "model": "Qwen/Qwen3-0.6B",
        "host": "127.0.0.1",
        "roles": roles,
    }


def measure(path: Path, runs: int) -> dict:
    from muse_launch.checks import engine
    from muse_launch.core import load_plan

    def preflight_alone() -> float:
        t = time.perf_counter()
        load_plan(path)
        return time.perf_counter() - t

    def preflight_with_check() -> tuple[float, engine.EngineCheckResult]:
        t = time.perf_counter()
        pending = engine.start_for_file(path)
        load_plan(path)
        result = pending.result()
        return time.perf_counter() - t, result

    preflight_with_check()  # warm-up (in "remembered" mode, the run that remembers)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    alone, total, results = [], [], []
    for _ in range(runs):
        alone.append(preflight_alone())
        seconds, result = preflight_with_check()
        total.append(seconds)
        results.append(result)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / runs
    return {
        "alone": statistics.median(alone),
        "total": statistics.median(total),
        "cpu": cpu,
        "notes": results[-1].notes,
        "errors": [f.message for f in results[-1].findings],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not (VENV / "bin" / "sglang").exists():
        sys.exit(f"{VENV} has no parsers: run scripts/install_engine_parsers.sh first")
    os.environ["PATH"] = os.pathsep.join(
        [str(VENV / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]]
    )
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "engine-check-32.yaml"
        big.write_text(yaml.safe_dump(topology_32(), sort_keys=False))
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # remembered passes of this run only
        for label, path in (
            ("epd-b300.yaml (4 roles)", ROOT / "topologies" / "epd-b300.yaml"),
            (f"32 roles ({big.name})", big),
        ):
            for mode, cache in (("parsed", "0"), ("remembered", "1")):
                os.environ["MUSE_LAUNCH_ENGINE_CHECK_CACHE"] = cache
                m = measure(path, args.runs)
                cpu = m["cpu"]  # of the timed runs; the runs without the check start no process
                added = m["total"] - m["alone"]
                print(
                    f"{label}, {mode}: the engine check adds {added:.2f} s to up's preflight "
                    f"({m['total']:.2f} s with it, {m['alone']:.2f} s without; median of {args.runs}); "
                    f"CPU of its processes {cpu:.2f} s"
                )
                for note in m["notes"]:
                    print(f"  {note}")
                for message in m["errors"]:
                    print(f"  ! {message}")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} CPUs (other work on the machine slows the imports)")


if __name__ == "__main__":
    main()
