"""`scale` and `restart`: changes of a running deployment, through its backend (muse_launch/backend.py);
the supervisor makes them one at a time (docs/live-changes.md)."""

from __future__ import annotations

import time

import typer

from muse_launch.commands.run import _deployment, _names


def _instances(record, role: str) -> list[str]:
    """The instances of `role` in the record, in replica order (`decode` or `decode-0` first)."""
    from muse_launch.supervise.change_executor import index_of

    found = [(index_of(r.name, role), r.name) for r in record.roles]
    return [name for index, name in sorted((i, n) for i, n in found if i is not None)]


def _say(text: str) -> None:
    from muse_launch.printable import escaped

    typer.echo(escaped(text))  # the supervisor's lines carry what roles and routers answered


def _role_of(record, role: str) -> list[str]:
    from muse_launch.errors import UsageError

    instances = _instances(record, role)
    if not instances:
        roles = sorted({r.name.rsplit("-", 1)[0] if r.name[-1:].isdigit() else r.name for r in record.roles})
        raise UsageError(f"{record.name} has no role {role!r}; roles: {', '.join(roles)}")
    return instances


def _replicas(text: str, role: str) -> int:
    """A count as typed: ASCII digits only (int() also reads `٣`), within the file's own cap."""
    from muse_launch.errors import UsageError
    from muse_launch.topology.model import MAX_REPLICAS

    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_REPLICAS:
        fix = "`down` stops it all" if text.isascii() and text.isdigit() and int(text) == 0 else None
        raise UsageError(
            f"scale {role} {text}: REPLICAS must be a whole number from 1 to {MAX_REPLICAS} "
            "(a role keeps at least 1 instance)",
            fix=fix,
        )
    return int(text)


def scale(
    name: str = typer.Argument(..., help="deployment name", autocompletion=_names),
    role: str = typer.Argument(..., help="a worker role of it (prefill, decode, worker)"),
    replicas: str = typer.Argument(..., help="how many instances it should have (1-256)"),
    drain_timeout: float = typer.Option(
        120.0, "--drain-timeout", help="seconds an instance taken out may finish its requests"
    ),
    allow_downtime: bool = typer.Option(
        False,
        "--allow-downtime",
        help="accept failed requests where the change cannot avoid them (vllm-router is restarted)",
    ),
) -> None:
    """More or fewer instances of a worker role of a running deployment, with no failed request: all or
    nothing (no room for every new instance: refused before any starts)."""
    from muse_launch.backends import backend_of
    from muse_launch.change import ScaleRole

    count = _replicas(replicas, role)
    run_dir, record = _deployment(name)
    instances = _role_of(record, role)
    if count == len(instances):
        typer.echo(f"{role}: already {count} instance{'s' * (count > 1)} ({', '.join(instances)})")
        return
    backend = backend_of(run_dir)
    why = f"scale {role} {len(instances)} -> {count}"
    began = time.monotonic()
    change = ScaleRole(role, count, why, drain_timeout, allow_downtime)
    result = backend.change(run_dir, change, _say)
    now = result.get("instances") if isinstance(result.get("instances"), list) else []
    typer.echo(
        f"{role}: {len(instances)} -> {len(now)} instances in {time.monotonic() - began:.1f}s "
        f"({', '.join(map(str, now))})"
    )


def restart(
    name: str = typer.Argument(..., help="deployment name", autocompletion=_names),
    role: str = typer.Argument(..., help="a role of it"),
    _rolling: bool = typer.Option(  # accepted, so that scripts passing it go on working; nothing to choose
        True,
        "--rolling",
        help="accepted and changes nothing: a restart always rolls, one instance at a time, each replaced "
        "before the next",
    ),
    allow_downtime: bool = typer.Option(
        False, "--allow-downtime", help="accept failed requests where nothing can serve while it restarts"
    ),
    drain_timeout: float = typer.Option(
        120.0, "--drain-timeout", help="seconds an instance taken out may finish its requests"
    ),
) -> None:
    """Replace every instance of a role with a fresh process, one at a time, with no failed request where
    capacity allows (another instance, or room for one surge instance)."""
    from muse_launch.backends import backend_of
    from muse_launch.change import RestartInstance

    run_dir, record = _deployment(name)
    instances = _role_of(record, role)
    backend = backend_of(run_dir)
    began = time.monotonic()
    # one change for the whole roll: no other is served between two of its instances
    with backend.held(run_dir, f"restart {role}, rolling over {len(instances)}", _say):
        for instance in instances:
            change = RestartInstance(instance, f"restart {role}", allow_downtime, drain_timeout)
            result = backend.change(run_dir, change, _say)
            _say(f"{instance}: replaced (generation {result.get('generation', '?')})")
    typer.echo(f"{role}: {len(instances)} restarted in {time.monotonic() - began:.1f}s")


def register(app: typer.Typer) -> None:
    # `scale NAME decode -1` reaches _replicas as a count (a tool's answer), not click's "No such option".
    app.command(context_settings={"ignore_unknown_options": True})(scale)
    app.command()(restart)
