"""The table, the charts (PNG, matplotlib without a display) and the self-contained HTML report of a run,
and of a comparison of runs. Every figure of a rehearsal is labelled simulated."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

COLUMNS = (
    "conc",
    "ok",
    "failed",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "ITL p99",
    "req/s",
    "out tok/s",
    "tok/s/GPU",
    "tok/s/user",
)


def plain(text: str) -> str:
    """`text` for a chart: a `$` is a dollar, never the start of matplotlib's mathtext."""
    return str(text).replace("$", r"\$")


def _f(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def row(p: dict) -> list[str]:
    return [
        str(p["concurrency"]),
        str(p["requests_ok"]),
        str(p["requests_failed"]),
        _f(p["ttft_ms"].get("p50")),
        _f(p["ttft_ms"].get("p99")),
        _f(p["itl_ms"].get("p50"), 2),
        _f(p["itl_ms"].get("p99"), 2),
        _f(p["requests_per_s"], 2),
        _f(p["output_tokens_per_s"]),
        _f(p.get("output_tokens_per_s_per_gpu")),
        _f(p.get("output_tokens_per_s_per_user")),
    ]


def _text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return [fmt.format(*header), *(fmt.format(*r) for r in rows)]


def sim_label(summary: dict) -> str:
    return "SIMULATED (rehearsal engine, no GPU): " if summary.get("simulated") else ""


def table_lines(summary: dict) -> list[str]:
    head = f"{sim_label(summary)}{summary['deployment']}: ms for TTFT/ITL, GPUs {summary.get('gpus') or '-'}"
    return [head, *_text_table(list(COLUMNS), [row(p) for p in summary["points"]])]


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


def charts(summary: dict, out: Path) -> dict[str, bytes]:
    """throughput.png, latency.png, pareto.png of the points that served requests; {} without matplotlib."""
    try:
        plt = _plt()
    except ImportError:
        return {}
    pts = [p for p in summary["points"] if p["requests_ok"]]
    if not pts:
        return {}
    c = [p["concurrency"] for p in pts]
    tag = " (simulated)" if summary.get("simulated") else ""
    made = {}
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(c, [p["output_tokens_per_s"] for p in pts], "o-", label="output tok/s")
    _concurrency_axis(ax, c)
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(c, [p["requests_per_s"] for p in pts], "s--", color="tab:orange", label="req/s")
    ax2.set_ylabel("requests/s")
    ax.set_title(f"{plain(summary['deployment'])}: throughput{tag}")
    made["throughput.png"] = _save(fig, out / "throughput.png")
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL")):
        for pct, style in (("p50", "o-"), ("p99", "x:")):
            ax.plot(c, [p[key].get(pct) for p in pts], style, label=f"{name} {pct}")
    _concurrency_axis(ax, c)
    if all((p[k].get(pct) or 0) > 0 for p in pts for k in ("ttft_ms", "itl_ms") for pct in ("p50", "p99")):
        ax.set_yscale("log")
    ax.set_ylabel("ms")
    ax.legend()
    ax.set_title(f"{plain(summary['deployment'])}: latency{tag}")
    made["latency.png"] = _save(fig, out / "latency.png")
    made["pareto.png"] = pareto_chart([{**summary, "points": pts}], out / "pareto.png")
    return made


def _per_gpu(p: dict) -> float:
    v = p.get("output_tokens_per_s_per_gpu")
    return v if v is not None else p["output_tokens_per_s"]


def pareto_chart(summaries: list[dict], path: Path) -> bytes:
    """tok/s per GPU (total tok/s on a CPU deployment) against tok/s per user, one line per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in summaries:
        pts = sorted(s["points"], key=lambda p: p["concurrency"])
        label = plain(s["deployment"]) + (" (simulated)" if s.get("simulated") else "")
        ax.plot(
            [p.get("output_tokens_per_s_per_user") or 0 for p in pts],
            [_per_gpu(p) for p in pts],
            "o-",
            label=label,
        )
        for p in pts:
            ax.annotate(
                str(p["concurrency"]), (p.get("output_tokens_per_s_per_user") or 0, _per_gpu(p)), fontsize=7
            )
    per_gpu = all(s.get("gpus") for s in summaries)
    ax.set_xlabel("output tokens/s per user")
    ax.set_ylabel("output tokens/s per GPU" if per_gpu else "output tokens/s (no GPU: total)")
    ax.legend(fontsize=8)
    ax.set_title("throughput against interactivity (labels: concurrency)")
    return _save(fig, path)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


STYLE = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #999;"
    "padding:3px 8px;text-align:right}.bad{color:#b00}.sim{background:#fe9;padding:4px}"
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
    verdict = "valid" if summary["valid"] else "INVALID"
    parts.append(f"<p class='{'ok' if summary['valid'] else 'bad'}'>{verdict}</p>")
    if summary["reasons"]:
        parts.append(
            "<ul>" + "".join(f"<li class='bad'>{html.escape(r)}</li>" for r in summary["reasons"]) + "</ul>"
        )
    plan = summary["plan"]
    parts.append(
        f"<p>{html.escape(summary['url'])}, model {html.escape(summary['model'])}, ISL {plan['isl']}, "
        f"OSL {plan['osl']}, GPUs {summary.get('gpus') or '-'}, plan digest "
        f"{html.escape(summary['plan_digest'][:16])}, versions {html.escape(str(summary['versions']))}</p>"
    )
    parts.append(_html_table(list(COLUMNS), [row(p) for p in summary["points"]]))
    parts += [f"<p class='bad'>{html.escape(w)}</p>" for w in summary.get("warnings", [])]
    (out / "report.html").write_text(html_page(f"bench {summary['deployment']}", parts, images))
    return sorted(images)
