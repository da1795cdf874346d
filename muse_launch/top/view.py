"""`top` on a terminal: the snapshot (collect.snapshot) as rich tables. "n/a": the backend does not give
that number (the reason is in the last column); "-": nothing to show this interval (no new request)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from muse_launch.render_status import style_of
from muse_launch.rundir.decisions import describe

NA = Text("n/a", style="dim")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
MAX_WORKERS_SHOWN = 200  # a router's table past this many workers says how many more there are


def _t(value: object, style: str = "") -> Text:
    """A cell from text the deployment or a router gave: never rich markup, no escape sequence."""
    return Text(_CONTROL.sub("?", str(value)), style=style)


def _num(value: float | None, fmt: str = "{:.0f}", unavailable: bool = False) -> Text | str:
    if value is None:
        return NA if unavailable else Text("-", style="dim")
    return fmt.format(value)


def _role_cells(row: Mapping[str, Any]) -> list[Text | str]:
    missing = row.get("metrics_unavailable") is not None
    if "requests_per_s" in row:  # a router: its load per worker and req/s are in its own table
        return [NA] * 7
    first_read = row.get("prompt_tokens_total") is not None and row["prompt_tokens_per_s"] is None
    kv = row.get("kv_cache_usage")
    ttft = row.get("ttft_s")
    return [
        _num(row.get("running"), unavailable=missing or row.get("running") is None),
        _num(row.get("queued"), unavailable=missing or row.get("queued") is None),
        _num(None if kv is None else kv * 100, "{:.1f}%", unavailable=True),
        _rate(
            row.get("prompt_tokens_per_s"), missing or (row.get("prompt_tokens_total") is None), first_read
        ),
        _rate(
            row.get("generation_tokens_per_s"),
            missing or (row.get("generation_tokens_total") is None),
            first_read,
        ),
        _quantiles(row.get("ttft_quantiles_s"), "{:.0f}")
        or (
            Text(f"{ttft * 1000:.0f} ms (mean)")
            if ttft is not None
            else Text("-", style="dim")
            if row.get("ttft_idle")
            else NA
        ),
        _quantiles(row.get("itl_quantiles_s"), "{:.1f}")
        or (Text("-", style="dim") if row.get("ttft_idle") or "itl_quantiles_s" not in row else NA),
    ]


def _quantiles(q: object, fmt: str) -> Text | None:
    """p50/p90/p99 in ms of the requests since the last reading; "-" where none came; None: no histogram."""
    if not isinstance(q, Mapping):
        return None
    values = [q.get(k) for k in ("p50", "p90", "p99")]
    if all(v is None for v in values):
        return Text("-", style="dim")
    return Text("/".join("-" if v is None else fmt.format(v * 1000) for v in values) + " ms")


def _rate(value: float | None, unavailable: bool, first_read: bool) -> Text | str:
    if unavailable:
        return NA
    if value is None:
        return Text("..." if first_read else "-", style="dim")
    return f"{value:.1f}"


def role_table(snap: Mapping[str, Any], once: bool = False) -> Table:
    when = (
        f"one reading: rates over {snap['interval_s']:g}s"
        if once
        else f"every {snap['interval_s']:g}s; Ctrl-C quits"
    )
    table = Table(title=_t(f"{snap['name']}: {snap['state']}  ({when})"), title_justify="left")
    for column, justify in (
        ("role", "left"),
        ("kind", "left"),
        ("state", "left"),
        ("health", "left"),
        ("restarts", "right"),
        ("running", "right"),
        ("queued", "right"),
        ("KV cache", "right"),
        ("prompt tok/s", "right"),
        ("gen tok/s", "right"),
        ("TTFT p50/p90/p99", "right"),
        ("ITL p50/p90/p99", "right"),
        ("metrics", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column != "metrics")
    for row in snap["roles"]:
        state = row["state"]
        style = style_of(state)
        health = row["health"]
        table.add_row(
            _t(row["name"]),
            _t(row["kind"]),
            _t(state, style=style),
            _t(health or "-", style="green" if health == "ok" else "red" if health else "dim"),
            _t(row["restarts"]),
            *_role_cells(row),
            _t(row["metrics_unavailable"] or "ok", style="yellow" if row["metrics_unavailable"] else "dim"),
        )
    return table


def router_tables(snap: Mapping[str, Any]) -> list[Table]:
    out = []
    for router in snap["routers"]:
        rate = router.get("requests_per_s")
        rate_text = "n/a req/s" if rate is None else f"{rate:.1f} req/s"
        table = Table(
            title=_t(f"router {router['router']}: {rate_text}; load per worker"), title_justify="left"
        )
        for column in ("worker", "role", "in flight", "healthy"):
            table.add_column(column, justify="right" if column == "in flight" else "left")
        if router["metrics_unavailable"]:
            table.add_row(_t(router["metrics_unavailable"], style="yellow"), "", NA, NA)
        elif not router["workers"]:
            table.add_row(Text("the router lists no worker in its metrics", style="dim"), "", NA, NA)
        for w in router["workers"][:MAX_WORKERS_SHOWN]:
            healthy = w["healthy"]
            table.add_row(
                _t(w["url"]),
                _t(w["role"]) if w["role"] else Text("not in this deployment", style="yellow"),
                NA if w["load"] is None else str(w["load"]),
                NA if healthy is None else Text("yes", style="green") if healthy else Text("no", style="red"),
            )
        more = len(router["workers"]) - MAX_WORKERS_SHOWN
        if more > 0:
            table.add_row(Text(f"... and {more} more (top --json lists them all)", style="dim"), "", "", "")
        out.append(table)
    return out


def render(snap: Mapping[str, Any], once: bool = False) -> Group:
    decisions = [
        Text(f"autoscale: {describe(d)}", style="cyan") for d in snap.get("autoscale_decisions") or []
    ]
    return Group(role_table(snap, once), *router_tables(snap), *decisions)
