"""The table, the charts (PNG, matplotlib without a display) and the self-contained HTML report of a run,
and of a comparison of runs. Every figure of a rehearsal is labelled simulated."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

LATENCY = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"))
PCTS = ("p50", "p90", "p99", "max")
COLUMNS = (
    "conc",
    "ok",
    "failed",
    *(f"{name} p50/p90/p99/max" for _, name in LATENCY),
    "req/s",
    "out tok/s",
    "tok/s/GPU",
    "tok/s/user",
)
GOODPUT_COLUMNS = ("in SLO", "good req/s", "good tok/s", "good tok/s/GPU")


def plain(text: str) -> str:
    """`text` for a chart: a `$` is a dollar, never the start of matplotlib's mathtext."""
    return str(text).replace("$", r"\$")


def _f(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pcts(figures: object, digits: int) -> str:
    f = figures if isinstance(figures, dict) else {}
    return "/".join(_f(f.get(k), digits) for k in PCTS)


def has_goodput(points: list[dict]) -> bool:
    return any(isinstance(p.get("goodput"), dict) for p in points)


def row(p: dict, goodput: bool = False) -> list[str]:
    cells = [
        str(p["concurrency"]),
        str(p["requests_ok"]),
        str(p["requests_failed"]),
        _pcts(p.get("ttft_ms"), 1),
        _pcts(p.get("itl_ms"), 2),
        _pcts(p.get("e2e_ms"), 0),
        _f(p["requests_per_s"], 2),
        _f(p["output_tokens_per_s"]),
        _f(p.get("output_tokens_per_s_per_gpu")),
        _f(p.get("output_tokens_per_s_per_user")),
    ]
    if goodput:
        g = p.get("goodput") if isinstance(p.get("goodput"), dict) else {}
        cells += [
            "-" if not g else f"{g.get('attained_pct', 0):.0f}%" + (" ok" if g.get("meets_slo") else " NO"),
            _f(g.get("requests_per_s"), 2),
            _f(g.get("output_tokens_per_s")),
            _f(g.get("output_tokens_per_s_per_gpu")),
        ]
    return cells


def columns(goodput: bool) -> list[str]:
    return [*COLUMNS, *(GOODPUT_COLUMNS if goodput else ())]


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return [fmt.format(*header), *(fmt.format(*r) for r in rows)]


def sim_label(summary: dict) -> str:
    return "SIMULATED (rehearsal engine, no GPU): " if summary.get("simulated") else ""


def table_lines(summary: dict) -> list[str]:
    head = f"{sim_label(summary)}{summary['deployment']}: latencies in ms, GPUs {summary.get('gpus') or '-'}"
    if summary.get("slo"):
        head += f"; SLO {slo_text(summary['slo'])}"
    good = has_goodput(summary["points"])
    return [head, *_text_table(columns(good), [row(p, good) for p in summary["points"]])]


def slo_text(slo: dict) -> str:
    targets = ", ".join(f"{k}<={v:g}ms" for k, v in (slo.get("targets_ms") or {}).items())
    return f"{targets} for {slo.get('attain_pct', 90):g}% of requests"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    _plt().close(fig)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _concurrency_axis(ax, c: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(c, [str(x) for x in c])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")


def _plain_axis(ax) -> None:
    """Numbers on a log axis as numbers (60, 100, 200), not 6x10^1."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    lo, hi = ax.get_ylim()
    # under a decade (60 to 190 ms) 1-2-5 would label one tick: label every step of it then
    subs = (1.0, 2.0, 5.0) if lo <= 0 or hi / lo >= 10 else (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def charts(summary: dict, out: Path) -> dict[str, bytes]:
    """throughput.png, latency.png, cdf.png (where aiperf's per-request export is there), pareto.png of the
    points that served requests; {} without matplotlib. Every chart has a legend and says its units."""
    try:
        plt = _plt()
    except ImportError:
        return {}
    pts = [p for p in summary["points"] if p["requests_ok"]]
    if not pts:
        return {}
    c = [p["concurrency"] for p in pts]
    name = plain(summary["deployment"])
    tag = " (simulated)" if summary.get("simulated") else ""
    made = {}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax.plot(c, [p["output_tokens_per_s"] for p in pts], "o-", label="output tokens/s (all GPUs)")
    if all(p.get("output_tokens_per_s_per_gpu") is not None for p in pts):
        ax.plot(c, [p["output_tokens_per_s_per_gpu"] for p in pts], "s--", label="output tokens/s per GPU")
    if has_goodput(pts):
        ax.plot(
            c,
            [(p.get("goodput") or {}).get("output_tokens_per_s") or 0 for p in pts],
            "^:",
            label="output tokens/s inside the SLO",
        )
    ax.set_ylabel("output tokens/s")
    ax2.plot(c, [p["requests_per_s"] for p in pts], "o-", color="tab:orange", label="requests/s")
    if has_goodput(pts):
        ax2.plot(
            c,
            [(p.get("goodput") or {}).get("requests_per_s") or 0 for p in pts],
            "^:",
            color="tab:green",
            label="requests/s inside the SLO (goodput)",
        )
    ax2.set_ylabel("requests/s")
    for a in (ax, ax2):
        _concurrency_axis(a, c)
        a.set_ylim(bottom=0)
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"{name}: throughput against concurrency{tag}")
    made["throughput.png"] = _save(fig, out / "throughput.png")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    targets = (summary.get("slo") or {}).get("targets_ms") or {}
    for ax, (key, label) in zip(axes, LATENCY, strict=True):
        for pct, style in (("p50", "o-"), ("p90", "s--"), ("p99", "x:"), ("max", "+-.")):
            ys = [(p.get(key) or {}).get(pct) for p in pts]
            if any(y is not None for y in ys):
                ax.plot(c, [float("nan") if y is None else y for y in ys], style, label=f"{label} {pct}")
        target = targets.get(key.split("_")[0])
        if target:
            ax.axhline(target, color="red", lw=1, label=f"SLO {target:g} ms")
        _concurrency_axis(ax, c)
        values = [(p.get(key) or {}).get(k) for p in pts for k in PCTS]
        if values and all(v is not None and v > 0 for v in values):
            ax.set_yscale("log")
            _plain_axis(ax)
        ax.set_ylabel(f"{label} (ms)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    fig.suptitle(f"{name}: latency percentiles against concurrency{tag}")
    made["latency.png"] = _save(fig, out / "latency.png")
    cdf = cdf_chart(summary, pts, out)
    if cdf:
        made["cdf.png"] = cdf
    made["pareto.png"] = pareto_chart([{**summary, "points": pts}], out / "pareto.png")
    return made


def cdf_chart(summary: dict, pts: list[dict], out: Path) -> bytes | None:
    """The share of requests at or under each latency, one line per concurrency, from aiperf's per-request
    export of each point (RUN/c<N>/profile_export.jsonl); None where no point has one."""
    from .aiperf import request_figures

    per_point = {p["concurrency"]: request_figures(out / f"c{p['concurrency']}") for p in pts}
    if not any(per_point.values()):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    targets = (summary.get("slo") or {}).get("targets_ms") or {}
    for ax, (key, label) in zip(axes, LATENCY, strict=True):
        short = key.split("_")[0]
        for conc, reqs in per_point.items():
            values = sorted(r[short] for r in reqs if r.get(short) is not None)
            if values:
                ax.step(
                    values,
                    [(i + 1) / len(values) for i in range(len(values))],
                    where="post",
                    label=f"concurrency {conc}",
                )
        target = targets.get(short)
        seen = [r[short] for reqs in per_point.values() for r in reqs if r.get(short) is not None]
        if target and seen and target > 1.5 * max(seen):  # drawn there, it would squash every curve to a line
            ax.plot([], [], color="red", lw=1, label=f"SLO {target:g} ms (far right of the axis)")
        elif target:
            ax.axvline(target, color="red", lw=1, label=f"SLO {target:g} ms")
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("share of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    sim = " (simulated)" if summary.get("simulated") else ""
    fig.suptitle(f"{plain(summary['deployment'])}: latency distribution (CDF){sim}")
    return _save(fig, out / "cdf.png")


def _per_gpu(p: dict) -> float:
    v = p.get("output_tokens_per_s_per_gpu")
    return v if v is not None else p["output_tokens_per_s"]


def pareto_chart(summaries: list[dict], path: Path) -> bytes:
    """Throughput per GPU (goodput per GPU where every run has an SLO; total tok/s on a CPU deployment)
    against tokens/s per user, one line per run, each point labelled with its concurrency."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 5))
    good = all(has_goodput(s["points"]) for s in summaries)

    def y(p: dict) -> float:
        if good:
            g = p.get("goodput") or {}
            v = g.get("output_tokens_per_s_per_gpu")
            return v if v is not None else g.get("output_tokens_per_s") or 0.0
        return _per_gpu(p)

    for s in summaries:
        pts = sorted(s["points"], key=lambda p: p["concurrency"])
        label = plain(s["deployment"]) + (" (simulated)" if s.get("simulated") else "")
        xs = [p.get("output_tokens_per_s_per_user") or 0 for p in pts]
        ys = [y(p) for p in pts]
        (line,) = ax.plot(xs, ys, "o-", label=label)
        if len(pts) <= 24:
            for p, x_, y_ in zip(pts, xs, ys, strict=True):
                ax.annotate(
                    f"c={p['concurrency']}",
                    (x_, y_),
                    textcoords="offset points",
                    xytext=(5, 5),
                    fontsize=8,
                    color=line.get_color(),
                )
    per_gpu = all(s.get("gpus") for s in summaries)
    ax.set_xlabel("output tokens/s per user (interactivity)")
    what = "goodput: output tokens/s inside the SLO" if good else "output tokens/s"
    ax.set_ylabel(f"{what} per GPU" if per_gpu else f"{what} (no GPU: total)")
    # room past the last point for its label, which the axes' edge would cut
    ax.set_xlim(0, max(ax.get_xlim()[1], 1e-9) * 1.12)
    ax.set_ylim(0, max(ax.get_ylim()[1], 1e-9) * 1.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("throughput against interactivity (c=: concurrency)")
    return _save(fig, path)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


STYLE = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #999;"
    "padding:3px 8px;text-align:right}.bad{color:#b00}.warn{color:#a60}.ok{color:#070}td.l{text-align:left}"
    ".sim{background:#fe9;padding:4px}img{max-width:100%}"
)


def html_page(title: str, parts: list[str], images: dict[str, bytes]) -> str:
    imgs = "".join(
        f'<p><img alt="{html.escape(n)}" src="data:image/png;base64,{base64.b64encode(b).decode()}"></p>'
        for n, b in images.items()
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{''.join(parts)}{imgs}</body></html>"
    )


def _e(value: object) -> str:
    return html.escape(str(value))


def verdict_html(summary: dict) -> list[str]:
    """The verdict and every reason for it: why a run is invalid, or why its figures are the client's."""
    verdict = summary.get("verdict") or ("valid" if summary["valid"] else "invalid")
    cls = "bad" if not summary["valid"] else "warn" if verdict != "valid" else "ok"
    why = summary.get("reasons") or summary.get("caveats") or []
    out = [f"<p class='{cls}'><b>Verdict: {_e(verdict.upper() if cls == 'bad' else verdict)}</b></p>"]
    if why:
        out.append("<ul>" + "".join(f"<li class='{cls}'>{_e(r)}</li>" for r in why) + "</ul>")
    elif verdict == "valid":
        out.append(
            "<p>Every point served its requests, the output lengths match the plan and the engines' own "
            "token counters, and the client machine was not saturated.</p>"
        )
    return out


def _role_text(role: object) -> str:
    """A role as a person reads it: name (kind, engine, GPUs)."""
    if not isinstance(role, dict):
        return str(role)
    gpus = role.get("gpus") or []
    what = [str(role.get(k)) for k in ("kind", "engine") if role.get(k)]
    if gpus:
        what.append(f"GPUs {','.join(map(str, gpus))}")
    return f"{role.get('name', '?')} ({', '.join(what)})"


def metadata_html(summary: dict) -> str:
    plan = summary["plan"]
    versions = summary.get("versions") if isinstance(summary.get("versions"), dict) else {}
    gpus = summary.get("host_gpus") or []
    client = summary.get("client") or {}
    rows = [
        ("date", f"{summary.get('started', '?')} to {summary.get('finished', '?')} (UTC)"),
        ("command", summary.get("command") or "-"),
        ("deployment", f"{summary['deployment']} through {summary['url']}"),
        ("model", summary["model"]),
        (
            "load",
            f"ISL {plan['isl']}, OSL {plan['osl']}, concurrency "
            f"{', '.join(map(str, plan['concurrency']))}, seed {plan.get('seed', 0)}",
        ),
        ("SLO", slo_text(summary["slo"]) if summary.get("slo") else "none (--slo ttft=500ms,itl=50ms)"),
        (
            "GPUs",
            str(summary.get("gpus") or "-")
            + (f" (host: {', '.join(str(g.get('name')) for g in gpus[:8])})" if gpus else ""),
        ),
        ("roles", ", ".join(_role_text(r) for r in summary.get("roles") or []) or "-"),
        ("topology digest", summary.get("plan_digest") or "-"),
        ("versions", ", ".join(f"{k} {v or 'not found'}" for k, v in versions.items()) or "-"),
        ("client", f"{client.get('host', '?')}, {client.get('cores', '?')} cores"),
    ]
    body = "".join(f"<tr><th>{_e(k)}</th><td class='l'>{_e(v)}</td></tr>" for k, v in rows)
    return f"<h2>Run</h2><table>{body}</table>"


def exports_html(summary: dict, out: Path) -> str:
    """Links to aiperf's own exports of each point, beside the report."""
    items = []
    for p in summary["points"]:
        d = f"c{p['concurrency']}"
        files = [
            f
            for f in (
                "profile_export_aiperf.json",
                "profile_export.jsonl",
                "profile_export_aiperf.csv",
                "aiperf.log",
            )
            if (out / d / f).is_file()
        ]
        if files:
            links = ", ".join(f"<a href='{_e(d)}/{_e(f)}'>{_e(f)}</a>" for f in files)
            items.append(f"<li>concurrency {p['concurrency']}: {links}</li>")
    return "<h2>aiperf's exports</h2><ul>" + "".join(items) + "</ul>" if items else ""


def write_report(summary: dict, out: Path) -> list[str]:
    try:
        images = charts(summary, out)
    except Exception as exc:  # noqa: BLE001  a chart that cannot be drawn must not hide the verdict
        summary.setdefault("warnings", []).append(f"warning: no charts ({type(exc).__name__}: {exc})")
        images = {}
    parts = []
    if summary.get("simulated"):
        parts.append(
            "<p class='sim'>SIMULATED: a rehearsal with the simulated engine; no figure here is a GPU's.</p>"
        )
    parts += verdict_html(summary)
    good = has_goodput(summary["points"])
    parts.append("<h2>Figures</h2><p>Latencies in ms: p50/p90/p99/max over the requests of each point.</p>")
    parts.append(_html_table(columns(good), [row(p, good) for p in summary["points"]]))
    parts += [
        f"<p class='bad'>{_e(w)}</p>"
        for w in summary.get("warnings", [])
        if w not in summary.get("caveats", [])
    ]
    parts.append(metadata_html(summary))
    parts.append(exports_html(summary, out))
    (out / "report.html").write_text(html_page(f"bench {summary['deployment']}", parts, images))
    return sorted(images)
