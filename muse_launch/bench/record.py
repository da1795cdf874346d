"""A bench run's record: one JSON per point, summary.json, the topology file, the plan's digest, engine
versions and GPUs, aiperf's raw export (left in each point's directory), the charts and report.html.

Layout (docs/bench.md):

    RUN/summary.json            valid, reasons, points[...] (the figures of each point), target, plan
    RUN/point-c<N>.json         one point, as in summary.json's points
    RUN/c<N>/                   aiperf's own artifacts of that point (profile_export_aiperf.json, raw jsonl,
    log)
    RUN/topology.yaml           the file the deployment was brought up from (as it is now)
    RUN/throughput.png, latency.png, pareto.png, report.html
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from .measure import BenchPlan, saturation_warning
from .target import Target

SUMMARY = "summary.json"
FORMAT = 1
MAX_TOPOLOGY_BYTES = 1024 * 1024


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def host_gpus() -> list[dict]:
    try:
        from muse_launch.host.gpus import read_gpu_view

        view = read_gpu_view()
    except Exception:  # noqa: BLE001  a record without the host's GPUs is still a record
        return []
    return [{"index": g.index, "name": g.name, "total_bytes": g.total_bytes} for g in view.gpus]


def copy_topology(source: str, out: Path) -> str | None:
    src = Path(source)
    try:
        if src.is_file() and src.stat().st_size <= MAX_TOPOLOGY_BYTES:
            shutil.copyfile(src, out / "topology.yaml")
            return "topology.yaml"
    except OSError:
        pass
    return None


def summary_of(target: Target, plan: BenchPlan, points: list[dict], started: float) -> dict:
    reasons = [r for p in points for r in p["reasons"]]
    return {
        "format": FORMAT,
        "valid": not reasons,
        "reasons": reasons,
        "simulated": target.simulated,
        "deployment": target.name,
        "url": target.url,
        "model": target.model,
        "tokenizer": target.tokenizer,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "plan": {
            "concurrency": list(plan.concurrencies),
            "isl": plan.isl,
            "osl": plan.osl,
            "requests": plan.requests,
            "duration_s": plan.duration,
            "seed": plan.seed,
        },
        "plan_digest": target.plan_digest,
        "topology_source": target.source,
        "versions": target.versions,
        "gpus": target.gpus,
        "roles": list(target.roles),
        "host_gpus": host_gpus(),
        "client": {"host": platform.node(), "cores": os.cpu_count()},
        "warnings": [w for w in [saturation_warning(points)] if w],
        "points": points,
    }


def write_run(
    target: Target,
    plan: BenchPlan,
    points: list[dict],
    out: Path,
    started: float,
    echo: Callable[[str], None],
) -> dict:
    from .report import table_lines, write_report

    out.mkdir(parents=True, exist_ok=True)
    summary = summary_of(target, plan, points, started)
    summary["topology_file"] = copy_topology(target.source, out)
    for p in points:
        write_json(out / f"point-c{p['concurrency']}.json", p)
    summary["charts"] = write_report(summary, out)
    write_json(out / SUMMARY, summary)
    for line in table_lines(summary):
        echo(line)
    for w in summary["warnings"]:
        echo(w)
    echo(f"record: {out}/ ({SUMMARY}, report.html)")
    echo("valid" if summary["valid"] else "INVALID: " + "; ".join(summary["reasons"]))
    return summary


def read_summary(run: Path) -> dict:
    """A run's summary.json, checked enough to compare (ValueError saying what is wrong)."""
    path = run / SUMMARY if run.is_dir() else run
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a bench record ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise ValueError(f"{path}: not a bench record (no points)")
    for p in data["points"]:
        if not isinstance(p, dict) or not isinstance(p.get("concurrency"), int):
            raise ValueError(f"{path}: a point without its concurrency")
    return data
