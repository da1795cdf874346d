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


# --- TTFT and ITL percentiles of the last window, from the engines' histograms -----------------------------

from muse_launch.top.collect import (  # noqa: E402
    Reading,
    _histograms,  # noqa: E402
    parse,
    quantile,
    window_quantiles,
)


def test_quantile_interpolates_as_prometheus_does():
    buckets = {0.1: 50.0, 0.2: 90.0, 0.5: 100.0, float("inf"): 100.0}
    assert quantile(0.5, buckets) == 0.1
    assert abs(quantile(0.9, buckets) - 0.2) < 1e-12
    assert abs(quantile(0.7, buckets) - 0.15) < 1e-12  # halfway between 50 and 90: halfway 0.1..0.2
    assert abs(quantile(0.99, buckets) - 0.47) < 1e-12
    assert quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None
    assert quantile(0.99, {0.1: 1.0, float("inf"): 100.0}) == 0.1  # past the last bound: its lower bound


def test_window_quantiles_are_of_the_requests_since_the_last_reading():
    text_before = "\n".join(
        [
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 1000',
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0"} 1000',
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 1000',
        ]
    )
    # 10 new requests, all slow (0.1-1 s): the window's p50 is slow though the lifetime's is fast
    text_now = text_before.replace("} 1000", "} 1010").replace('le="0.1"} 1010', 'le="0.1"} 1000')
    from muse_launch.top.collect import WANTED

    before = Reading(1.0, "u", histograms=_histograms(parse(text_before, WANTED["vllm"]), "vllm"))
    now = Reading(2.0, "u", histograms=_histograms(parse(text_now, WANTED["vllm"]), "vllm"))
    q = window_quantiles(now, before, "ttft")
    assert q is not None and abs(q["p50"] - 0.55) < 1e-9 and abs(q["p99"] - 0.991) < 1e-9
    assert window_quantiles(now, None, "ttft") is None  # the first reading: no window yet
    assert window_quantiles(now, before, "itl") is None  # no ITL histogram: n/a
    assert window_quantiles(now, now, "ttft") == {"p50": None, "p90": None, "p99": None}  # idle
    assert window_quantiles(before, now, "ttft") is None  # a counter went back: a restart


def test_percentiles_are_on_screen():
    row = snap([])["roles"][0]
    row.update(ttft_quantiles_s={"p50": 0.1, "p90": 0.2, "p99": 0.45}, itl_quantiles_s=None)
    out = screen({**snap([]), "roles": [row]})
    assert "100/200/450 ms" in out and "TTFT p50/p90/p99" in out and "ITL p50/p90/p99" in out
