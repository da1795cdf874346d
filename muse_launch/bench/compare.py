"""`bench compare RUN RUN...`: one table and one Pareto chart across recorded runs (P/D against aggregated,
two P/D ratios, two hosts). A run's label is its deployment name, with the run directory's name when two
runs share one."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from pathlib import Path

from muse_launch.errors import UsageError

from .report import _html_table, _text_table, columns, has_goodput, html_page, pareto_chart, row
from .run_record import printable, read_summary, write_json


def labels(runs: list[Path], summaries: list[dict]) -> list[str]:
    names = [printable(s.get("deployment") or "?") for s in summaries]
    return [
        n if names.count(n) == 1 else f"{n} ({printable(r.name)})" for n, r in zip(names, runs, strict=True)
    ]


def resolve_run(arg: Path) -> Path:
    """A run directory (or its summary.json) by path, or by its id: the directory name `bench` gave it
    (DEPLOYMENT/ID or ID alone, found under each deployment's bench/ in the state home)."""
    if arg.exists() or arg.is_symlink():
        return arg
    from muse_launch.rundir.state import state_home

    parts = arg.parts
    if len(parts) not in (1, 2) or any(x in ("", ".", "..") for x in parts):
        raise UsageError(f"no run {printable(arg)}", fix="give a run directory, or a run id `bench` printed")
    home = state_home()
    pattern = f"{parts[0]}/bench/{parts[1]}" if len(parts) == 2 else f"*/bench/{parts[0]}"
    found = sorted(p for p in home.glob(pattern) if p.is_dir()) if home.is_dir() else []
    if not found:
        raise UsageError(
            f"no run {printable(arg)}: not a path, nor a run id under {home}/*/bench/",
            fix="give a run directory, or a run id `bench` printed (DEPLOYMENT/ID where ids repeat)",
        )
    if len(found) > 1:
        raise UsageError(
            f"run id {printable(arg)} names {len(found)} runs: "
            + ", ".join(f"{p.parent.parent.name}/{p.name}" for p in found[:5]),
            fix="name it as DEPLOYMENT/ID",
        )
    return found[0]


def comparison(runs: list[Path]) -> tuple[list[dict], list[str]]:
    summaries = []
    for run in runs:
        try:
            summaries.append(read_summary(run))
        except ValueError as exc:
            raise UsageError(str(exc), fix="give run directories that `muse-launch bench` wrote") from None
    return summaries, labels(runs, summaries)


def table(summaries: list[dict], names: list[str]) -> tuple[list[str], list[list[str]]]:
    good = any(has_goodput(s["points"]) for s in summaries)
    header = ["run", "valid", *columns(good)]
    rows = []
    for s, name in zip(summaries, names, strict=True):
        tag = name + (" (simulated)" if s.get("simulated") else "")
        for p in sorted(s["points"], key=lambda p: p["concurrency"]):
            rows.append([tag, "yes" if s.get("valid") else "NO", *row(p, good)])
    return header, rows


def compare_runs(runs: list[Path], out: Path | None, echo: Callable[[str], None]) -> int:
    if len(runs) < 2:
        raise UsageError("bench compare needs two runs or more", fix="muse-launch bench compare RUN RUN...")
    runs = [resolve_run(r) for r in runs]
    summaries, names = comparison(runs)
    header, rows = table(summaries, names)
    for line in _text_table(header, rows):
        echo(line)
    diffs = differences(summaries, names)
    diff_header = ["conc", "metric", "baseline", "run", "base value", "value", "delta", "ratio"]
    diff_rows = [
        [
            str(d["concurrency"]),
            d["metric"],
            d["baseline"],
            d["run"],
            _num(d["base_value"]),
            _num(d["value"]),
            _num(d["delta"], signed=True),
            "-" if d["ratio"] is None else f"{d['ratio']:.2f}x",
        ]
        for d in diffs
    ]
    if diff_rows:
        echo("")
        echo(f"against {names[0]} (the first run), at each concurrency both measured:")
        for line in _text_table(diff_header, diff_rows):
            echo(line)
    out = out or runs[0].resolve().parent / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--out {printable(out)}: cannot be a directory ({exc.strerror or exc})",
            fix="give a directory for the comparison",
        ) from None
    named = [{**s, "deployment": n} for s, n in zip(summaries, names, strict=True)]
    images = {}
    try:
        images["pareto.png"] = pareto_chart(named, out / "pareto.png")
    except ImportError:
        echo(
            "warning: matplotlib is not installed: no chart "
            "(pip install -e '.[bench]' in the muse-launch checkout)"
        )
    parts = [_html_table(header, rows)]
    if diff_rows:
        parts.append(f"<h2>Against {html.escape(names[0])}</h2>")
        parts.append(_html_table(diff_header, diff_rows))
    if any(s.get("simulated") for s in summaries):
        parts.insert(0, "<p class='sim'>Runs marked simulated come from rehearsals: no GPU figure.</p>")
    invalid = [n for s, n in zip(summaries, names, strict=True) if not s.get("valid")]
    if invalid:
        parts.insert(0, f"<p class='bad'>INVALID runs: {', '.join(invalid)}</p>")
    (out / "report.html").write_text(html_page("bench compare", parts, images))
    write_json(
        out / "compare.json",
        {
            "runs": [str(r) for r in runs],
            "labels": names,
            "valid": [bool(s.get("valid")) for s in summaries],
            "rows": [dict(zip(header, r, strict=True)) for r in rows],
            "differences": diffs,
        },
    )
    echo(f"comparison: {out}/ (report.html, pareto.png, compare.json)")
    for n in invalid:
        echo(f"warning: {n} is not a valid run; its figures are shown but do not count")
    return 0


# (label, how to read it from a point; higher is better?) goodput first: the figure a launch is decided on
METRICS: tuple[tuple[str, Callable[[dict], object], bool], ...] = (
    ("good tok/s/GPU", lambda p: (p.get("goodput") or {}).get("output_tokens_per_s_per_gpu"), True),
    ("good req/s", lambda p: (p.get("goodput") or {}).get("requests_per_s"), True),
    ("in SLO %", lambda p: (p.get("goodput") or {}).get("attained_pct"), True),
    ("tok/s/GPU", lambda p: p.get("output_tokens_per_s_per_gpu"), True),
    ("out tok/s", lambda p: p.get("output_tokens_per_s"), True),
    ("req/s", lambda p: p.get("requests_per_s"), True),
    ("tok/s/user", lambda p: p.get("output_tokens_per_s_per_user"), True),
    *(
        (f"{name} {pct} ms", (lambda k, q: lambda p: (p.get(k) or {}).get(q))(key, pct), False)
        for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
        for pct in ("p50", "p90", "p99")
    ),
)


def _value(read: Callable[[dict], object], p: dict) -> float | None:
    v = read(p)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def differences(summaries: list[dict], names: list[str]) -> list[dict]:
    """Each run against the first, per concurrency both measured: the value, delta and ratio of every metric
    both have (goodput first where both have it)."""
    base = {p["concurrency"]: p for p in summaries[0]["points"]}
    out = []
    for s, name in zip(summaries[1:], names[1:], strict=True):
        for p in sorted(s["points"], key=lambda p: p["concurrency"]):
            b = base.get(p["concurrency"])
            if b is None:
                continue
            for label, read, higher_better in METRICS:
                v0, v1 = _value(read, b), _value(read, p)
                if v0 is None or v1 is None:
                    continue
                out.append(
                    {
                        "concurrency": p["concurrency"],
                        "metric": label,
                        "baseline": names[0],
                        "run": name,
                        "base_value": v0,
                        "value": v1,
                        "delta": round(v1 - v0, 4),
                        "ratio": round(v1 / v0, 4) if v0 else None,
                        "higher_is_better": higher_better,
                    }
                )
    return out


def _num(v: float | None, signed: bool = False) -> str:
    if v is None:
        return "-"
    text = f"{v:+.4g}" if signed else f"{v:.4g}"
    return text
