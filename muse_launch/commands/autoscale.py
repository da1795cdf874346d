"""`muse-launch autoscale NAME --advise`: the autoscaler in the foreground, for any deployment, reading its
roles' metrics as `top` does and printing what it would do and why (docs/autoscale.md)."""

from __future__ import annotations

import typer


def autoscale(
    name: str | None = typer.Argument(
        None, help="deployment name or topology file (default: the one running)"
    ),
    advise: bool = typer.Option(
        False,
        "--advise",
        help="only say and record what it would do (the supervisor acts where the file says act)",
    ),
    file: str | None = typer.Option(
        None, "--file", help="the topology file whose autoscale: block to use (default: the one it came from)"
    ),
    interval: float | None = typer.Option(None, "--interval", min=0.2, help="seconds between decisions"),
    steps: int | None = typer.Option(None, "--steps", min=1, help="decide this many times, then exit"),
) -> None:
    """Decide every interval, for each scaled role, the next change that keeps the latency targets with the
    fewest GPUs; each decision is printed and appended to decisions.jsonl in the run directory."""
    import threading

    from muse_launch.backends import backend_of
    from muse_launch.errors import UsageError
    from muse_launch.rundir.state import read_state, resolve_name
    from muse_launch.supervise.autoscaler import Autoscaler, Setup, loop
    from muse_launch.top.deadline import bounded_client
    from muse_launch.topology.load import load_topology

    if not advise:
        raise UsageError(
            "autoscale runs in the foreground with --advise only",
            fix="give --advise; to act, set `autoscale: {mode: act}` in the file: its supervisor acts",
        )
    run_dir = resolve_name(name)
    record = read_state(run_dir)
    if record is None:
        raise UsageError(f"deployment {run_dir.name!r} has no state", fix="`muse-launch ls` lists them")
    source = file or record.source
    setup = Setup.of(load_topology(source).topology)
    if setup is None:
        raise UsageError(
            f"{source} has no autoscale: block",
            fix="add one (docs/autoscale.md), or give --file FILE with one",
        )
    backend = backend_of(run_dir)

    def current():
        now = read_state(run_dir)
        return backend.observe(now) if now is not None else None

    auto = Autoscaler(setup, run_dir, None, typer.echo, verbose=True)
    typer.echo(
        f"autoscale {run_dir.name}: advising every {interval or setup.config.interval:g}s from {source}; "
        "Ctrl-C ends it"
    )
    try:
        with bounded_client(3.0) as client:
            loop(auto, current, threading.Event(), client, interval=interval, steps=steps)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def register(app: typer.Typer) -> None:
    app.command()(autoscale)
