"""`top`'s screen from a snapshot: labels a router or a deployment gives are shown as text (never rich markup,
never raw escape sequences), a router with very many workers is drawn in bounded time, and `--once` says it
is one reading."""

import io
import time

from rich.console import Console

from muse_launch.top.view import MAX_WORKERS_SHOWN, render


def snap(workers: list[dict], name: str = "pd") -> dict:
    return {
        "name": name,
        "state": "running",
        "interval_s": 1.0,
        "roles": [
            {
                "name": "decode[/x]",
                "kind": "decode",
                "engine": "vllm",
                "state": "running",
                "health": "ok",
                "restarts": 0,
                "metrics_unavailable": "metrics: \x1b[31mred\x1b]0;title\x07",
                "running": 1,
                "queued": 0,
                "kv_cache_usage": 0.5,
                "prompt_tokens_per_s": 1.0,
                "generation_tokens_per_s": 2.0,
                "ttft_s": 0.1,
                "ttft_idle": False,
                "prompt_tokens_total": 10,
                "generation_tokens_total": 20,
            }
        ],
        "routers": [
            {"router": "router", "metrics_unavailable": None, "workers": workers, "requests_per_s": 1.0}
        ],
    }


def screen(s: dict, once: bool = False) -> str:
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None, force_terminal=False).print(render(s, once))
    return buf.getvalue()


def test_labels_are_text_not_markup_nor_escape_sequences():
    workers = [{"url": "http://[/x]:1", "role": "[bold]r[/bold]", "load": 1, "healthy": True}]
    out = screen(snap(workers, name="dep\x1b[2J"))
    assert "decode[/x]" in out and "http://[/x]:1" in out and "[bold]r[/bold]" in out
    assert "\x1b" not in out and "\x07" not in out
    assert "dep?[2J" in out


def test_once_header_describes_one_reading():
    assert "Ctrl-C" in screen(snap([]))
    once = screen(snap([]), once=True)
    assert "Ctrl-C" not in once and "every" not in once and "one reading" in once


def test_a_router_listing_88000_workers_draws_in_bounded_time():
    workers = [
        {"url": f"http://w{i}:8000", "role": None, "load": i % 7, "healthy": True} for i in range(88_000)
    ]
    started = time.monotonic()
    out = screen(snap(workers))
    assert time.monotonic() - started < 5
    assert f"and {88_000 - MAX_WORKERS_SHOWN} more" in out
