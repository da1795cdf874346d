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
import re
import shlex
import shutil
import stat
import sys
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


def command_line() -> str:
    return "muse-launch " + shlex.join(sys.argv[1:])


def verdict_of(reasons: list[str], caveats: list[str]) -> str:
    """ "invalid" (a reason), "valid, client-limited" (the load generator was starved: the figures are a
    lower bound of the deployment's), or "valid"."""
    return "invalid" if reasons else "valid, client-limited" if caveats else "valid"


def summary_of(target: Target, plan: BenchPlan, points: list[dict], started: float) -> dict:
    reasons = [r for p in points for r in p["reasons"]]
    warnings = [w for w in [saturation_warning(points)] if w]
    return {
        "format": FORMAT,
        "valid": not reasons,
        "verdict": verdict_of(reasons, warnings),
        "reasons": reasons,
        "caveats": warnings,
        "command": command_line(),
        "slo": plan.slo.as_dict() if plan.slo else None,
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
        "warnings": warnings,
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
    if not summary["valid"]:
        echo("INVALID: " + "; ".join(summary["reasons"]))
    elif summary["caveats"]:
        echo(
            "valid, client-limited: the load generator was starved; the figures are its limit, "
            "not the deployment's"
        )
    else:
        echo("valid")
    return summary


MAX_SUMMARY_BYTES = 16 * 1024 * 1024
MAX_POINTS = 256  # a plan's concurrency levels; a record with more is not one this program wrote
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NUMBERS = (
    "requests_per_s",
    "output_tokens_per_s",
    "output_tokens_per_s_per_gpu",
    "output_tokens_per_s_per_user",
)


def printable(text: object) -> str:
    """`text` with its control characters (escape sequences) shown as `?`: safe for a terminal."""
    return _CONTROL.sub("?", str(text))


def refuse_existing(out: Path) -> None:
    """A record directory must be new or empty of records: a second run into it would mix two runs."""
    from muse_launch.errors import UsageError

    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {printable(out)} is a file, not a directory", fix="give a directory")
    if not out.is_dir():
        return
    held = [
        e.name for e in out.iterdir() if e.name == SUMMARY or re.fullmatch(r"point-c\d+\.json|c\d+", e.name)
    ]
    if held:
        raise UsageError(
            f"--out {printable(out)} already holds a bench record ({', '.join(sorted(held)[:3])}): a second "
            "run into it would mix two runs' points",
            fix="give a new --out directory (or remove the old record first)",
        )


def _read_regular(path: Path) -> str:
    """The text of a regular file of at most MAX_SUMMARY_BYTES; ValueError for anything else (a device, a
    FIFO: opened without blocking, never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_SUMMARY_BYTES:
            raise ValueError(f"over {MAX_SUMMARY_BYTES >> 20} MiB")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_SUMMARY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SUMMARY_BYTES:
        raise ValueError(f"over {MAX_SUMMARY_BYTES >> 20} MiB")
    return data.decode("utf-8", errors="replace")


def _number(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _check_point(p: object) -> str | None:
    """Why a point cannot be compared, or None."""
    if not isinstance(p, dict):
        return "a point that is not an object"
    c = p.get("concurrency")
    if not isinstance(c, int) or isinstance(c, bool) or c < 1:
        return "a point without its concurrency"
    for key in ("requests_ok", "requests_failed"):
        v = p.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            return f"concurrency {c}: {key} is not a count"
    for key in ("ttft_ms", "itl_ms"):
        figures = p.get(key)
        if not isinstance(figures, dict) or not all(_number(v) for v in figures.values()):
            return f"concurrency {c}: {key} is not a set of figures"
    e2e = p.get("e2e_ms", {})  # older records have none
    if not isinstance(e2e, dict) or not all(_number(v) for v in e2e.values()):
        return f"concurrency {c}: e2e_ms is not a set of figures"
    for key in _NUMBERS:
        if not _number(p.get(key)):
            return f"concurrency {c}: {key} is not a number"
    good = p.get("goodput")
    if good is not None and (
        not isinstance(good, dict)
        or not all(_number(v) for k, v in good.items() if k not in ("slo", "meets_slo"))
    ):
        return f"concurrency {c}: goodput is not a set of figures"
    if p.get("requests_per_s") is None or p.get("output_tokens_per_s") is None:
        return f"concurrency {c}: no throughput figures"
    return None


def read_summary(run: Path) -> dict:
    """A run's summary.json, checked enough to compare (ValueError saying what is wrong)."""
    path = run / SUMMARY if run.is_dir() else run
    where = printable(path)
    try:
        data = json.loads(_read_regular(path))
    except RecursionError:
        raise ValueError(f"{where}: not a bench record (nested too deep)") from None
    except ValueError as exc:
        raise ValueError(f"{where}: not a bench record ({printable(exc)})") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise ValueError(f"{where}: not a bench record (no points)")
    if len(data["points"]) > MAX_POINTS:
        raise ValueError(
            f"{where}: {len(data['points'])} points, more than a bench run writes ({MAX_POINTS})"
        )
    for p in data["points"]:
        why = _check_point(p)
        if why:
            raise ValueError(f"{where}: {why}")
    if not isinstance(data.get("deployment", ""), str):
        raise ValueError(f"{where}: its deployment name is not a string")
    if not _number(data.get("gpus")):
        raise ValueError(f"{where}: its GPU count is not a number")
    return data
