"""The autoscaler against static deployments, on the same load trace through aiperf (docs/autoscale.md).

    .venv/bin/python scripts/bench_autoscale.py            # the trace of docs/autoscale.md (~15 min)
    .venv/bin/python scripts/bench_autoscale.py --quick    # a short one (~6 min)

The trace: `--base` concurrent streams for a while, a step to three times that, a plateau, then nothing.
It runs against a rehearsal of examples/autoscale-rehearse.yaml (simulated workers that take
`rehearse: ready_after` seconds to start), once autoscaled and once per static shape (its `autoscale:`
block removed, prefill and decode at fixed replicas): the smallest, the largest, and those between; the
best static one is the cheapest of them that keeps >= 95% of requests inside both targets. For each it
prints the share of requests inside both targets, GPU-seconds (instances x GPUs each, sampled every
0.5 s from the trace's start to its end), failed requests, decisions, reversals while the load is steady,
and the seconds from the load's end until prefill and decode are both back at their minimum.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from muse_launch.bench import aiperf as ap  # noqa: E402
from muse_launch.bench.target import find_tokenizer  # noqa: E402

FILE = REPO / "examples" / "autoscale-rehearse.yaml"


def muse(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "muse_launch", *args], env=env, cwd=REPO, capture_output=True, text=True
    )
    if check and done.returncode:
        raise SystemExit(f"muse-launch {' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    return done


def variant(base: dict, shape: tuple[int, int] | None, at: Path) -> Path:
    """The file autoscaled (shape None) or static at (prefill, decode) replicas, one GPU an instance."""
    data = json.loads(json.dumps(base))
    if shape is not None:
        p, d = shape
        data.pop("autoscale")
        data["name"] = f"static-{p}p{d}d"
        data["roles"]["prefill"].update(replicas=p, gpus=list(range(p)))
        data["roles"]["decode"].update(replicas=d, gpus=list(range(p, p + d)))
    path = at / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def counts(name: str, env: dict[str, str]) -> dict[str, int]:
    status = json.loads(muse("status", name, "--json", env=env).stdout)
    out: dict[str, int] = {}
    for role in status["roles"]:
        if role["kind"] in ("prefill", "decode") and role["state"] not in ("stopped", "failed"):
            out[role["kind"]] = out.get(role["kind"], 0) + 1
    return out


def run_one(path: Path, name: str, phases: list[tuple[int, float]], idle_s: float, env, targets, out: Path):
    muse("up", str(path), "--rehearse", "-d", env=env)
    run_dir = Path(env["MUSE_LAUNCH_HOME"]) / name
    samples: list[tuple[float, dict[str, int]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            samples.append((time.monotonic(), counts(name, env)))

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        status = json.loads(muse("status", name, "--json", env=env).stdout)
        router = next(r for r in status["roles"] if r["kind"] == "router")["url"]
        aiperf = ap.find_aiperf()
        with httpx.Client() as client:  # the tokenizer directory the simulated workers serve
            workers = [r["url"] for r in status["roles"] if r["kind"] in ("prefill", "decode")]
            tokenizer = find_tokenizer(client, workers, [])
        if tokenizer is None:
            raise SystemExit(f"{name}: the workers name no local tokenizer")
        sampler.start()
        # The step is a second aiperf on top of the first, so the base load never pauses while aiperf
        # starts (its start-up takes seconds to a minute on a busy host).
        (base_c, base_s), (step_c, step_s) = phases
        runs = [(base_c, base_s + step_s, 0.0), (step_c - base_c, step_s, base_s)]
        results: list[Path] = []
        plateau_from = time.time() + base_s

        def drive(i: int, concurrency: int, seconds: float, after: float) -> None:
            time.sleep(after)
            # a request takes about a second (48 tokens, 20 ms each): more than it can send in time
            plan = ap.PointPlan(concurrency, 64, 48, int(concurrency * seconds * 2) + 10, seconds, seed=i)
            where = out / name / f"load{i}"
            argv = ap.point_argv(aiperf, router, "Qwen/Qwen3-0.6B", tokenizer, plan, where)
            ap.run_point(argv, where, seconds + 600, lambda s: None)
            results.append(where)

        drivers = [threading.Thread(target=drive, args=(i, *r)) for i, r in enumerate(runs)]
        for t in drivers:
            t.start()
        for t in drivers:
            t.join()
        figures, failed = [], 0
        for where in results:
            figures += ap.request_figures(where)
            try:
                failed += ap.read_point(where).requests_failed
            except ValueError:
                failed += 1  # no export at all: counted as a failure of the run
        load_end = time.monotonic()
        back = None
        while time.monotonic() - load_end < idle_s:
            if samples and samples[-1][1] == {"prefill": 1, "decode": 1} and back is None:
                back = max(0.0, samples[-1][0] - load_end)  # a static shape at the minimum: 0
            time.sleep(0.5)
        stop.set()
        sampler.join(5)
        end = time.monotonic()
        gpu_s = 0.0
        for (t0, c), (t1, _) in zip(samples, samples[1:] + [(end, {})], strict=False):
            gpu_s += (t1 - t0) * sum(c.values())
        inside = [
            f
            for f in figures
            if f.get("ttft", 1e9) <= targets["ttft"] * 1000 and f.get("itl", 0) <= targets["itl"] * 1000
        ]
        lines = []
        path_d = run_dir / "decisions.jsonl"
        if path_d.exists():
            lines = [json.loads(x) for x in path_d.read_text().splitlines()]
        made = [x for x in lines if x["from"] != x["to"]]
        settled = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(plateau_from + phases[-1][1] / 2))
        steady = [x for x in made if x["at"] >= settled]  # the plateau's second half
        by_role: dict[str, list[int]] = {}
        for x in steady:
            if x["kind"] in ("up", "down"):
                by_role.setdefault(x["role"], []).append(1 if x["to"] > x["from"] else -1)
        reversals = sum(sum(1 for a, b in zip(m, m[1:], strict=False) if a != b) for m in by_role.values())
        return {
            "variant": name,
            "inside_targets_pct": round(100 * len(inside) / len(figures), 1) if figures else None,
            "requests": len(figures),
            "gpu_seconds": round(gpu_s, 1),
            "failed": failed,
            "decisions": len(made),
            "reversals_at_steady_load": reversals,
            "seconds_back_to_min": None if back is None else round(back, 1),
        }
    finally:
        stop.set()
        muse("down", name, env=env, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short trace")
    parser.add_argument("--base", type=int, default=2, help="concurrent streams before the step")
    parser.add_argument("--json", action="store_true", help="one JSON object per variant")
    args = parser.parse_args()
    base = yaml.safe_load(FILE.read_text())
    targets = base["autoscale"]["targets"]
    step = (20.0, 40.0, 25.0) if args.quick else (60.0, 180.0, 60.0)
    phases = [(args.base, step[0]), (3 * args.base, step[1])]
    bounds = base["autoscale"]["roles"]
    small = (bounds["prefill"]["min"], bounds["decode"]["min"])
    large = (bounds["prefill"]["max"], bounds["decode"]["max"])
    middle = [(1, 2), (2, 2), (2, 3)] if not args.quick else [(1, 3)]
    shapes = [small, *[s for s in middle if s not in (small, large)], large]
    with tempfile.TemporaryDirectory() as tmp:
        at = Path(tmp)
        env = {**os.environ, "MUSE_LAUNCH_HOME": str(at / "home")}
        rows = []
        for shape in [None, *shapes]:
            path = variant(base, shape, at)
            name = yaml.safe_load(path.read_text())["name"]
            rows.append(run_one(path, name, phases, step[2], env, targets, at / "out"))
            print(json.dumps(rows[-1]) if args.json else rows[-1], flush=True)
    statics = [r for r in rows[1:] if (r["inside_targets_pct"] or 0) >= 95 and not r["failed"]]
    best = min(statics, key=lambda r: r["gpu_seconds"]) if statics else None
    print()
    print(
        f"{'variant':18} {'inside %':>9} {'GPU-s':>8} {'failed':>7} {'decisions':>9} "
        f"{'reversals':>9} {'back s':>7}"
    )
    for r in rows:
        label = r["variant"] + (" (best static)" if r is best else "")
        print(
            f"{label:18} {r['inside_targets_pct']!s:>9} {r['gpu_seconds']:>8} {r['failed']:>7} "
            f"{r['decisions']:>9} {r['reversals_at_steady_load']:>9} {r['seconds_back_to_min']!s:>7}"
        )
    if best:
        print(f"autoscaled GPU-seconds / best static: {rows[0]['gpu_seconds'] / best['gpu_seconds']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
