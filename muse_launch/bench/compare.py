"""`bench compare RUN RUN...`: one table and one Pareto chart across recorded runs (P/D against aggregated,
two P/D ratios, two hosts). A run's label is its deployment name, with the run directory's name when two
runs share one."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from muse_launch.errors import UsageError

from .record import printable, read_summary, write_json
from .report import COLUMNS, _html_table, _text_table, html_page, pareto_chart, row


def labels(runs: list[Path], summaries: list[dict]) -> list[str]:
    names = [printable(s.get("deployment") or "?") for s in summaries]
    return [
        n if names.count(n) == 1 else f"{n} ({printable(r.name)})" for n, r in zip(names, runs, strict=True)
    ]


def comparison(runs: list[Path]) -> tuple[list[dict], list[str]]:
    summaries = []
    for run in runs:
        try:
            summaries.append(read_summary(run))
        except ValueError as exc:
            raise UsageError(str(exc), fix="give run directories that `muse-launch bench` wrote") from None
    return summaries, labels(runs, summaries)


def table(summaries: list[dict], names: list[str]) -> tuple[list[str], list[list[str]]]:
    header = ["run", "valid", *COLUMNS]
    rows = []
    for s, name in zip(summaries, names, strict=True):
        tag = name + (" (simulated)" if s.get("simulated") else "")
        for p in sorted(s["points"], key=lambda p: p["concurrency"]):
            rows.append([tag, "yes" if s.get("valid") else "NO", *row(p)])
    return header, rows


def compare_runs(runs: list[Path], out: Path | None, echo: Callable[[str], None]) -> int:
    if len(runs) < 2:
        raise UsageError("bench compare needs two runs or more", fix="muse-launch bench compare RUN RUN...")
    summaries, names = comparison(runs)
    header, rows = table(summaries, names)
    for line in _text_table(header, rows):
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
        echo("warning: matplotlib is not installed: no chart (pip install 'muse-launch[bench]')")
    parts = [_html_table(header, rows)]
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
        },
    )
    echo(f"comparison: {out}/ (report.html, pareto.png, compare.json)")
    for n in invalid:
        echo(f"warning: {n} is not a valid run; its figures are shown but do not count")
    return 0
