"""The runtime's commands: up, down, status, logs, ls. Thin: parse, call the runtime, print."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import httpx
import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table

from muse_launch.errors import UsageError
from muse_launch.run.down import bring_down, format_report
from muse_launch.run.explain import explain_addresses
from muse_launch.run.lifecycle import DeploymentState
from muse_launch.run.logs import LogFollower, RolePrinter, last_lines
from muse_launch.run.state import RunDir, is_locked, read_state, resolve_name, running_deployments
from muse_launch.run.status import health_now, observed, status_json, status_table
from muse_launch.run.up import UpOptions, bring_up, refuse_multi_node

FOLLOW_SECONDS = 0.2
SMOKE_FAILURE_CHARS = 800


def _console() -> Console:
    """Rich's 80 columns would cut a table piped to a file or grep; a terminal keeps its own width."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def up(
    file: Path = typer.Argument(..., help="topology file"),
    detach: bool = typer.Option(False, "--detach", "-d", help="return once all roles are ready, leaving a supervisor"),
    rehearse: bool = typer.Option(False, "--rehearse", help="simulated engines in place of GPU ones, real router"),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="after ready, a role that dies stops everything"),
    keep: bool = typer.Option(False, "--keep", help="when a role fails to start, leave the others running"),
    only: Optional[str] = typer.Option(None, "--only", help="start this role alone; its dependencies must be up"),
    set_: List[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
    engine_check: bool = typer.Option(True, "--engine-check/--no-engine-check", help="parse each command with "
                                      "the installed engine's own parser first (not with --rehearse)"),
) -> None:
    """Start a topology in dependency order, each role polled ready, and keep it up."""
    from muse_launch.checks import engine as engine_check_
    from muse_launch.core import load_plan

    pending = engine_check_.start_for_file(file, set_) if engine_check and not rehearse else None
    try:
        loaded = load_plan(file, set_, rehearse=rehearse)
    except BaseException:
        engine_check_.cancel(pending)
        raise
    for finding in loaded.findings:
        typer.echo(loaded.redact(finding.format(loaded.loaded)), err=True)
    if pending and engine_check_.report(pending.result(), loaded.loaded, lambda line: typer.echo(line, err=True)):
        raise typer.Exit(1)  # a command the engine refuses: nothing started
    if not rehearse:
        refuse_multi_node(loaded.plan)
    options = UpOptions(detach=detach, fail_fast=fail_fast, keep=keep, only=only)
    raise typer.Exit(bring_up(loaded.plan, loaded.source, loaded.redact, options, _console()))


def down(
    name: Optional[str] = typer.Argument(None, help="deployment name or topology file (default: the one running)"),
    grace: Optional[float] = typer.Option(None, "--grace", min=0, help="seconds from stop signal to SIGKILL, "
                                          "for every role (default: each role's stop.grace)"),
) -> None:
    """Stop a deployment in reverse dependency order; returns when nothing of it is alive and its ports are closed."""
    report = bring_down(resolve_name(name), grace)
    for line in format_report(report):
        typer.echo(line)
    raise typer.Exit(0 if report.clean else 1)


def status(
    name: Optional[str] = typer.Argument(None, help="deployment name (default: the one running)"),
    as_json: bool = typer.Option(False, "--json", help="SPEC section 5's JSON, plus each role's health now"),
    watch: bool = typer.Option(False, "--watch", help="refresh every second until Ctrl-C"),
) -> None:
    """Per role: state, pid, GPUs, URL, ready since, restarts, health now."""
    from muse_launch.host.versions import deployment_versions

    run_dir = resolve_name(name)
    console = _console()
    versions = deployment_versions(read_state(run_dir).roles)  # engine -> installed release, read once
    with httpx.Client() as client:
        def render() -> str | Table:
            record = observed(read_state(run_dir))
            health = health_now(record, run_dir, client)
            if as_json:  # --watch: JSON lines
                return json.dumps(status_json(record, health, versions), indent=None if watch else 2)
            return status_table(record, health, versions)

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
            raise typer.Exit(0)


def logs(
    name: Optional[str] = typer.Argument(None, help="deployment name (default: the one running)"),
    roles: Optional[List[str]] = typer.Argument(None, help="roles to show (default: all)"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines until Ctrl-C"),
    lines: int = typer.Option(100, "--lines", "-n", min=0, help="how many of the last lines of each role"),
) -> None:
    """Role logs, each line prefixed with its role (coloured on a terminal)."""
    roles = list(roles or [])
    is_deployment = name is None or RunDir.of(name).state_file.exists() or Path(name).is_file()
    if not is_deployment and len(running_deployments()) == 1:
        roles.insert(0, name)  # `logs prefill` with one deployment running: a role, not a deployment
        name = None
    run_dir = resolve_name(name)
    record = read_state(run_dir)
    known = [r.name for r in record.roles]
    unknown = [r for r in roles if r not in known]
    if unknown:
        raise UsageError(f"{record.name} has no role {', '.join(unknown)}; roles: {', '.join(known)}")
    chosen = roles or known
    console = _console()
    printer = RolePrinter(console.file, chosen, colour=console.is_terminal)
    follower = LogFollower({r: run_dir.log(r) for r in chosen}, from_end=True)  # before the tail: no line lost
    for role in chosen:
        for text in last_lines(run_dir.log(role), lines):
            printer.line(role, text)
    printer.flush()
    if not follow:
        return
    try:
        while True:
            follower.print_new(printer)
            record = read_state(run_dir)
            if record.state is DeploymentState.STOPPED and not is_locked(run_dir):
                follower.print_new(printer)
                return
            time.sleep(FOLLOW_SECONDS)
    except KeyboardInterrupt:
        raise typer.Exit(0)


def smoke(
    name: Optional[str] = typer.Argument(None, help="deployment name (default: the one running)"),
    timeout: float = typer.Option(600.0, "--timeout", help="seconds per request"),
) -> None:
    """One chat completion through the router (plus reasoning and tool-call checks where the parsers are on)."""
    from muse_launch.engines import ENGINES
    from muse_launch.engines.argv import last_value
    from muse_launch.smoke import run_smoke

    record = read_state(resolve_name(name))
    routers = [r for r in record.roles if r.kind == "router" and r.url]
    front = routers[0] if routers else next((r for r in record.roles if r.url and r.kind != "command"), None)
    if front is None:
        raise UsageError(f"{record.name} has no router or worker with a URL to send a request to")
    workers = [r for r in record.roles if r.kind in ("decode", "worker", "prefill")]
    readers = [(ENGINES[r.engine], r.argv) for r in workers if r.engine in ENGINES]
    reasoning = any(engine.reasoning(argv) for engine, argv in readers)
    tools = any(engine.tool_calls(argv) for engine, argv in readers)
    # argv starts with the launcher: read the flag only, not the engine's positional model
    served = next((name for engine, argv in readers if (name := last_value(argv, engine.SERVED_MODEL_NAME))), None)
    base = front.url.replace("0.0.0.0", "127.0.0.1")
    typer.echo(f"{record.name}: smoke through {front.name} at {base}")
    results = run_smoke(base, reasoning, tools, timeout, model=served)
    for result in results:
        timing = f"ttft {result.ttft * 1000:.0f} ms, " if result.ttft is not None else ""
        mark = "ok  " if result.ok else "FAIL"
        detail = result.detail[:160] if result.ok else result.detail[:SMOKE_FAILURE_CHARS]  # a failure at length
        typer.echo(f"  {mark} {result.check:<10} {timing}total {result.total * 1000:.0f} ms  {detail}")
    failures = "\n".join(r.detail for r in results if not r.ok)
    for line in explain_addresses(failures, record):  # the roles behind the addresses in the errors
        typer.echo(f"  where: {line}")
    raise typer.Exit(0 if results and all(r.ok for r in results) else 1)


def ls() -> None:
    """Running deployments."""
    running = running_deployments()
    if not running:
        typer.echo("no deployment is running")
        return
    table = Table("name", "state", "roles", "supervisor", "file")
    for record in map(observed, running):
        ready = sum(r.state.value == "ready" for r in record.roles)
        table.add_row(record.name, record.state.value, f"{ready}/{len(record.roles)} ready",
                      str(record.supervisor.pid) if record.supervisor else "none", record.source)
    _console().print(table)


def register(app: typer.Typer) -> None:
    for command in (up, down, status, logs, smoke, ls):
        app.command()(command)
