"""`muse-launch top [NAME]`: a live view of a running deployment from its roles' own metrics (docs/top.md)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import typer

MIN_INTERVAL = 0.2
HEALTH_DEADLINE_S = 3.0  # a role's probe or metrics answer, whole


def top(
    name: str | None = typer.Argument(
        None, help="deployment name or topology file (default: the one running)"
    ),
    once: bool = typer.Option(
        False, "--once", help="read twice, one interval apart, print one view and exit"
    ),
    as_json: bool = typer.Option(
        False, "--json", help="the view as JSON (with --once: one object; else one line per interval)"
    ),
    interval: float = typer.Option(1.0, "--interval", min=MIN_INTERVAL, help="seconds between reads"),
) -> None:
    """Per role: state, health, restarts, running and queued requests, KV cache, tokens/s, TTFT; each router's
    load per worker. From the engines' and routers' own Prometheus metrics; n/a where a backend has none."""
    import itertools

    from muse_launch.rundir.state import resolve_name

    frames = _frames(resolve_name(name), interval)
    try:
        snap = next(frames)
        if once:
            _print(next(frames), as_json, once=True)
        elif as_json or not sys.stdout.isatty():
            for frame in itertools.chain([snap], frames):
                _print(frame, as_json)
        else:
            _live(snap, frames)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    finally:
        frames.close()


def _frames(run_dir, interval: float) -> Iterator[dict]:
    """A snapshot (collect.snapshot) now, then one every `interval` seconds, with the rates since the last."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from muse_launch.backends import backend_of
    from muse_launch.errors import RuntimeFailure
    from muse_launch.rundir.decisions import recent_decisions
    from muse_launch.rundir.state import read_state
    from muse_launch.supervise.probe import health_now
    from muse_launch.top.collect import read_all, snapshot
    from muse_launch.top.deadline import bounded_client

    backend = backend_of(run_dir)
    before = None
    # every answer whole within HEALTH_DEADLINE_S: a server trickling its headers cannot hold a frame
    with bounded_client(HEALTH_DEADLINE_S) as client, ThreadPoolExecutor(max_workers=16) as pool:
        while True:
            started = time.monotonic()
            record = read_state(run_dir)
            if record is None:
                raise RuntimeFailure(
                    f"deployment {run_dir.name!r} has no state any more ({run_dir.state_file} is gone)",
                    fix=f"`muse-launch down {run_dir.name}` stops whatever of it still runs",
                )
            record = backend.observe(record)  # its roles as the backend sees them now
            readings = read_all(record, client, pool)
            health = health_now(record, run_dir, client, backend.listener_owners(record, run_dir))
            snap = snapshot(record, readings, before, health, interval)
            decisions = recent_decisions(run_dir, 3)  # the autoscaler's last ones (docs/autoscale.md)
            yield {**snap, "autoscale_decisions": decisions} if decisions else snap
            before = readings
            time.sleep(max(0.0, interval - (time.monotonic() - started)))


def _print(snap: dict, as_json: bool, once: bool = False) -> None:
    import json

    if as_json:
        typer.echo(json.dumps(snap))
        return
    from rich.console import Console

    from muse_launch.top.view import render

    Console(width=None if sys.stdout.isatty() else 200).print(render(snap, once))


def _live(snap: dict, frames: Iterator[dict]) -> None:
    """Full screen, redrawn at each snapshot; the terminal as it was once it ends."""
    from rich.live import Live

    from muse_launch.top.view import render

    with Live(render(snap), screen=True, auto_refresh=False) as live:
        for snap in frames:
            live.update(render(snap), refresh=True)


def register(app: typer.Typer) -> None:
    app.command()(top)
