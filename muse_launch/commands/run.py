"""The runtime's commands: up, down, status, logs, ls. Thin: parse, call the runtime, print."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from muse_launch.rundir.state import DeploymentRecord, RunDir

# Start-up time is part of the interface: this module imports typer only, and each command the
# runtime modules it needs (httpx, rich, psutil, the plan) when it runs. `down` of nothing and
# `--help` never load them.


def _console() -> Console:
    """Rich's 80 columns would cut a table piped to a file or grep; a terminal keeps its own width."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _names(incomplete: str) -> list[str]:
    """Shell completion of NAME: the deployments in the state home."""
    from muse_launch.rundir.state import state_home

    home = state_home()
    return (
        sorted(p.name for p in home.iterdir() if p.is_dir() and p.name.startswith(incomplete))
        if home.is_dir()
        else []
    )


def _role_names(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of `logs NAME ROLE...`: the roles of NAME, or of the one running when NAME is left out
    (or is itself a role). Never raises: a completion that fails prints nothing."""
    from muse_launch.rundir.state import RunDir, read_state, running_deployments

    try:
        name = ctx.params.get("name")
        if name and RunDir.of(name).state_file.exists():
            record = read_state(RunDir.of(name))
        else:
            running = running_deployments()
            record = running[0] if len(running) == 1 else None
        given = set(ctx.params.get("roles") or ())
        return [
            r.name
            for r in (record.roles if record else ())
            if r.name.startswith(incomplete) and r.name not in given and r.name != name
        ]
    except Exception:  # noqa: BLE001  a damaged state or a bad name: no completions
        return []


def _names_or_roles(ctx: typer.Context, incomplete: str) -> list[str]:
    """`logs NAME|ROLE`: a deployment, or, with one deployment running, one of its roles (`logs prefill`)."""
    return _names(incomplete) + [r for r in _role_names(ctx, incomplete) if r not in _names(incomplete)]


def _deployment(name: str | None) -> tuple[RunDir, DeploymentRecord]:
    """NAME's run directory and record; a clear error when its state is gone or unreadable."""
    from muse_launch.errors import RuntimeFailure
    from muse_launch.rundir.state import read_state, resolve_name

    run_dir = resolve_name(name)
    record = read_state(run_dir)  # StateDamaged (exit 1) when it cannot be read back
    if record is None:
        raise RuntimeFailure(
            f"deployment {run_dir.name!r} has no state any more ({run_dir.state_file} is gone)",
            fix=f"`muse-launch down {run_dir.name}` stops whatever of it still runs",
        )
    return run_dir, record


def up(
    file: Path = typer.Argument(..., help="topology file"),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="return once all roles are ready, leaving a supervisor"
    ),
    rehearse: bool = typer.Option(
        False, "--rehearse", help="simulated engines in place of GPU ones, real router"
    ),
    fail_fast: bool = typer.Option(
        False, "--fail-fast", help="after ready, a role that dies stops everything"
    ),
    keep: bool = typer.Option(False, "--keep", help="when a role fails to start, leave the others running"),
    only: str | None = typer.Option(
        None, "--only", help="start this role alone; its dependencies must be up"
    ),
    set_: list[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
    skip_gpu_check: bool = typer.Option(
        False, "--skip-gpu-check", help="start without reading the host's GPUs"
    ),
    engine_check: bool = typer.Option(
        True,
        "--engine-check/--no-engine-check",
        help="parse each command with the installed engine's own parser first (not with --rehearse)",
    ),
    on: str | None = typer.Option(
        None,
        "--on",
        help="slurm: submit one job, each role a step on its node; "
        "k8s: apply the exported manifests to a cluster (docs/kubernetes.md)",
    ),
    partition: str | None = typer.Option(None, "--partition", help="--on slurm: sbatch --partition"),
    account: str | None = typer.Option(None, "--account", help="--on slurm: sbatch --account"),
    time_limit: str | None = typer.Option(None, "--time", help="--on slurm: sbatch --time"),
    sbatch: list[str] = typer.Option(
        [], "--sbatch", help="--on slurm: one more sbatch option, e.g. --sbatch=--qos=x"
    ),
    to: str | None = typer.Option(
        None, "--to", help="--on k8s: lws (LeaderWorkerSet, default) | rbg (RoleBasedGroup)"
    ),
    context: str | None = typer.Option(None, "--context", help="--on k8s: the kubeconfig context"),
    namespace: str | None = typer.Option(
        None, "--namespace", "-n", help="--on k8s: the namespace (default: default)"
    ),
    image: list[str] = typer.Option([], "--image", help="--on k8s: IMAGE for every role, or ROLE=IMAGE"),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="print what `up` would change in the running deployment (or start, when none runs), and stop",
    ),
) -> None:
    """Start a topology in dependency order, each role polled ready, and keep it up. On a deployment of the
    file that runs: print the difference, then apply it, leaving unchanged roles alone (docs/apply.md)."""
    from muse_launch.backends import backend_named, backends, claim_for
    from muse_launch.checks import engine as engine_check_
    from muse_launch.core import UpRequest, load_plan
    from muse_launch.errors import UsageError

    backend = backend_named(on) if on is not None else backends()["local"]
    given = {
        "--keep": keep,
        "--only": only,
        "--skip-gpu-check": skip_gpu_check,
        "--partition": partition,
        "--account": account,
        "--time": time_limit,
        "--sbatch": tuple(sbatch),
        "--to": to,
        "--context": context,
        "--namespace": namespace,
        "--image": tuple(image),
    }
    flags = {flag: value for flag, value in given.items() if value not in (None, False, ())}
    _refuse_flags_of_others(backend, flags)  # before anything is read or started
    pending = engine_check_.start_for_file(file, set_) if engine_check and not rehearse else None
    try:
        loaded = load_plan(file, set_, rehearse=rehearse)
    except BaseException:
        engine_check_.cancel(pending)
        raise
    for finding in loaded.findings:
        typer.echo(loaded.redact(finding.format(loaded.loaded)), err=True)
    if pending and engine_check_.report(
        pending.result(), loaded.loaded, lambda line: typer.echo(line, err=True)
    ):
        raise typer.Exit(1)  # a command the engine refuses: nothing started
    if dry_run and only:
        raise UsageError("--dry-run shows the difference of the whole file", fix="leave out --only")
    if not only:  # `--only ROLE` of a running deployment is refused as before: it starts, it does not change
        from muse_launch.commands.apply import up_changes

        code = up_changes(loaded, on, rehearse, dry_run, typer.echo, tuple(set_))
        if code is not None:
            raise typer.Exit(code)
    request = UpRequest(detach, fail_fast, rehearse, tuple(set_), flags)
    raise typer.Exit(backend.bring_up(loaded, request, _console(), claim_for(backend.name)))


def _refuse_flags_of_others(backend, flags: dict) -> None:
    """A flag of another backend's `up` is refused, not ignored: it names the backend that takes it."""
    from muse_launch.backends import backends
    from muse_launch.errors import UsageError

    other = [flag for flag in flags if flag not in backend.flags]
    if not other:
        return
    owners = {flag: b.name for b in backends().values() for flag in b.flags}
    here = "on this host" if backend.name == "local" else f"with --on {backend.name}"
    takes = sorted({owners[flag] for flag in other if owners[flag] != "local"})
    raise UsageError(
        f"{', '.join(other)}: not {here}{backend.not_here}",
        fix=f"leave {'them' if len(other) > 1 else 'it'} out"
        + (f", or `up --on {takes[0]}`" if len(takes) == 1 else ""),
    )


def down(
    name: str | None = typer.Argument(
        None, help="deployment name or topology file (default: the one running)", autocompletion=_names
    ),
    grace: float | None = typer.Option(
        None,
        "--grace",
        min=0,
        help="seconds from stop signal to SIGKILL, for every role (default: each role's stop.grace)",
    ),
    as_json: bool = typer.Option(False, "--json", help="what was stopped as one JSON document"),
) -> None:
    """Stop a deployment in reverse dependency order; returns when nothing of it is alive, its ports are
    closed and none of its processes holds GPU memory."""
    import json

    from muse_launch.errors import UsageError
    from muse_launch.rundir.state import StateDamaged, resolve_name, running_deployments

    damaged: list[StateDamaged] = []
    if name is None and not running_deployments(damaged):
        if damaged:
            names = ", ".join(exc.run_dir.name for exc in damaged)
            raise UsageError(
                f"no deployment is running whose state reads back; damaged: {names}",
                fix=f"`muse-launch down {damaged[0].run_dir.name}` stops what carries its marker",
            )
        nothing = "no deployment is running; nothing to stop"
        if as_json:
            nothing = json.dumps({"name": None, "stopped": [], "clean": True, "notes": [nothing]}, indent=2)
        typer.echo(nothing)
        return
    import contextlib
    import sys

    from muse_launch.backends import backend_of

    run_dir = resolve_name(name)
    # By its state, or by its marker where the state is damaged (the local backend reads it under the lock).
    # With --json a backend's progress lines go to stderr: stdout is the one document.
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        report = backend_of(run_dir).stop(run_dir, grace)
    for line in [report.to_json()] if as_json else report.lines():
        typer.echo(line)
    raise typer.Exit(0 if report.clean else 1)


def status(
    name: str | None = typer.Argument(
        None, help="deployment name (default: the one running)", autocompletion=_names
    ),
    as_json: bool = typer.Option(
        False, "--json", help="the deployment as JSON, each role's health now included (docs/status-json.md)"
    ),
    watch: bool = typer.Option(False, "--watch", help="refresh every second until Ctrl-C"),
) -> None:
    """Per role: state, pid, GPUs, GPU memory, URL, ready since, restarts, health now."""
    import time

    import httpx  # noqa: F401  first: without it, `status` says which package it needs
    from rich.live import Live
    from rich.table import Table

    from muse_launch.backends import backend_of
    from muse_launch.render_status import render as draw
    from muse_launch.rundir.decisions import recent_decisions
    from muse_launch.supervise.probe import HTTP_TIMEOUT
    from muse_launch.top.deadline import bounded_client

    run_dir, _ = _deployment(name)
    console = _console()
    backend = backend_of(run_dir)
    # each probe's answer whole within its time budget, however a server trickles it (plain HTTP: no CA)
    with bounded_client(HTTP_TIMEOUT) as client:

        def render() -> str | Table:
            return draw(backend.status(run_dir, client), as_json, watch, recent_decisions(run_dir))

        def show(rendered: str | Table) -> None:
            typer.echo(rendered) if isinstance(rendered, str) else console.print(rendered)

        if not watch:
            show(render())
            return
        try:
            if console.is_terminal and not as_json:
                with Live(render(), console=console, auto_refresh=False) as live:
                    while True:
                        time.sleep(1.0)
                        live.update(render(), refresh=True)
            while True:
                show(render())
                time.sleep(1.0)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


def logs(
    name: str | None = typer.Argument(
        None, help="deployment name (default: the one running)", autocompletion=_names_or_roles
    ),
    roles: list[str] | None = typer.Argument(
        None, help="roles to show (default: all)", autocompletion=_role_names
    ),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines until Ctrl-C"),
    lines: int = typer.Option(100, "--lines", "-n", min=0, help="how many of the last lines of each role"),
    raw: bool = typer.Option(
        False,
        "--raw",
        help="the roles' bytes as written: their escape sequences and "
        "carriage returns reach the terminal (shown escaped by default)",
    ),
) -> None:
    """Role logs, each line prefixed with its role (coloured on a terminal)."""

    from muse_launch.backends import backend_of
    from muse_launch.errors import INTERRUPTED, UsageError
    from muse_launch.rundir.logs import RolePrinter
    from muse_launch.rundir.state import RunDir, running_deployments

    roles = list(roles or [])
    is_deployment = name is None or RunDir.of(name).state_file.exists() or Path(name).is_file()
    running = [] if is_deployment else running_deployments()
    if len(running) == 1:
        only = running[0]
        known = [r.name for r in only.roles]
        if name not in known:  # neither: name what it is not, not "ONLY has no role NAME"
            import shlex

            raise UsageError(
                f"no deployment or role named {name!r}; running: {only.name} (roles: {', '.join(known)})",
                fix=f"`{shlex.join(['muse-launch', 'logs', only.name, *[r for r in roles if r in known]])}`",
            )
        roles.insert(0, name)  # `logs prefill` with one deployment running: a role, not a deployment
        name = None
    run_dir, record = _deployment(name)
    known = [r.name for r in record.roles]
    unknown = [r for r in roles if r not in known]
    if unknown:
        raise UsageError(f"{record.name} has no role {', '.join(unknown)}; roles: {', '.join(known)}")
    chosen = roles or known
    console = _console()
    # A secret the role prints is hidden as `up` hides it, by the digests state.json keeps (proc/masks.py).
    printer = RolePrinter(console.file, chosen, colour=console.is_terminal, raw=raw, mask=record.masks.text)
    try:  # Ctrl-C as soon as the last lines are out ends `logs -f` as it does later: exit status 0
        backend_of(run_dir).print_logs(run_dir, chosen, lines, follow, printer)
    except KeyboardInterrupt:
        raise typer.Exit(0 if follow else INTERRUPTED) from None


def smoke(
    name: str | None = typer.Argument(
        None, help="deployment name (default: the one running)", autocompletion=_names
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds per request"),
    as_json: bool = typer.Option(
        False, "--json", help="the checks as one JSON document (docs/status-json.md)"
    ),
) -> None:
    """One chat completion through the router (plus reasoning and tool-call checks where the parsers are
    on)."""
    from muse_launch.backends import backend_of
    from muse_launch.smoke import smoke_record

    run_dir, record = _deployment(name)
    # as the backend sees it now: roles that died unwatched show as failed; on Kubernetes, at the pods
    raise typer.Exit(smoke_record(backend_of(run_dir).observe(record), timeout, typer.echo, as_json))


def ls(
    as_json: bool = typer.Option(
        False, "--json", help="a JSON list, one object per deployment (docs/status-json.md)"
    ),
) -> None:
    """Running deployments."""
    import json

    from rich.table import Table

    from muse_launch.rundir.state import RunDir, StateDamaged, running_deployments

    damaged: list[StateDamaged] = []
    running = running_deployments(damaged)
    if not running and not damaged:
        typer.echo("[]" if as_json else "no deployment is running")
        return
    from muse_launch.backends import backend_of

    rows = [
        {
            "name": record.name,
            "state": record.shown_state,
            "ready": sum(r.state.value == "ready" for r in record.roles),
            "roles": len(record.roles),
            "supervisor_pid": record.supervisor.pid if record.supervisor else None,
            "file": record.source,
        }
        for record in (backend_of(RunDir.of(r.name)).observe(r) for r in running)
    ]
    rows += [
        {
            "name": exc.run_dir.name,
            "state": "state damaged",
            "ready": None,
            "roles": None,
            "supervisor_pid": None,
            "file": None,
            "state_file": str(exc.run_dir.state_file),
        }
        for exc in damaged
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        table = Table("name", "state", "roles", "supervisor", "file")
        for row in rows:
            damaged_row = row["roles"] is None
            ready = "-" if damaged_row else f"{row['ready']}/{row['roles']} ready"
            table.add_row(
                row["name"],
                row["state"],
                ready,
                "-" if damaged_row else str(row["supervisor_pid"] or "none"),
                row.get("state_file") or row["file"],
            )
        _console().print(table)
    for exc in damaged:  # said once per deployment; the others are listed as usual
        for line in exc.lines():
            typer.echo(line, err=True)


def register(app: typer.Typer) -> None:
    for command in (up, down, status, logs, smoke, ls):
        app.command()(command)
