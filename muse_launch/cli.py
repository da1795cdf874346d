"""The command line: parse, call the core, print. Errors map to exit codes in main().

The core is imported inside each command: `down` and `status` need no topology schema, and
every command pays for what it imports.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer

from .errors import TopologyError, UserError

app = typer.Typer(
    name="muse-launch",
    help="Bring a disaggregated LLM serving topology up from one file, and down with nothing left behind.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class PlanFormat(str, Enum):
    text = "text"
    json = "json"
    shell = "shell"
    docker = "docker"


@app.command()
def validate(
    file: Path = typer.Argument(..., help="topology file"),
    strict: bool = typer.Option(False, "--strict", help="warnings fail too"),
    as_json: bool = typer.Option(False, "--json", help="findings as JSON, for tools"),
    set_: List[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
    engine_check: bool = typer.Option(False, "--engine-check", help="parse each command with the installed "
                                      "engine's and router's own parser too (what `up` does)"),
) -> None:
    """Check a topology against the hardware and itself before anything starts."""
    from .core import check_file
    from .checks import Severity

    try:
        loaded, findings, plan = check_file(file, set_)
    except TopologyError as exc:
        if not as_json:
            raise
        typer.echo(json.dumps({"file": str(file), "ok": False, "errors": exc.problems}, indent=2))
        raise typer.Exit(exc.exit_code)
    if engine_check and plan is not None:
        from .checks.engine import check

        result = check(plan, loaded)
        findings += result.findings
        for note in result.notes:
            typer.echo(loaded.redact(note), err=True)
    failed = any(f.severity is Severity.ERROR or strict for f in findings)
    if as_json:
        typer.echo(json.dumps({"file": str(file), "ok": not failed,
                               "findings": [f.to_dict(loaded) for f in findings]}, indent=2))
    else:
        for f in findings:
            typer.echo(loaded.redact(f.format(loaded)), err=True)
        errors = sum(f.severity is Severity.ERROR for f in findings)
        warnings = len(findings) - errors
        verdict = "FAILED" if failed else "ok"
        typer.echo(f"{file}: {verdict} ({len(loaded.topology.roles)} roles, {errors} errors, {warnings} warnings)")
    raise typer.Exit(1 if failed else 0)


@app.command()
def plan(
    file: Path = typer.Argument(..., help="topology file"),
    fmt: PlanFormat = typer.Option(PlanFormat.text, "--format", "-f", help="text | json | shell | docker"),
    rehearse: bool = typer.Option(False, "--rehearse", help="the plan `up --rehearse` would run"),
    set_: List[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
) -> None:
    """Show each role's exact argv, env, GPUs, ports and probe, in start order."""
    from . import render_text
    from .core import load_plan

    loaded_plan = load_plan(file, set_, rehearse=rehearse)
    for f in loaded_plan.findings:
        typer.echo(loaded_plan.redact(f.format(loaded_plan.loaded)), err=True)
    installed = ""
    if not rehearse and fmt in (PlanFormat.text, PlanFormat.shell):
        from .checks.engine import installed_here

        installed = installed_here(loaded_plan.plan, loaded_plan.loaded, lambda line: typer.echo(line, err=True))
    renderers = {
        PlanFormat.text: render_text.plan_text,
        PlanFormat.json: lambda p, r, t: json.dumps(p.to_dict(r), indent=2),
        PlanFormat.shell: render_text.plan_shell,
        PlanFormat.docker: render_text.plan_docker,
    }
    head, _, rest = renderers[fmt](loaded_plan.plan, loaded_plan.redact, loaded_plan.loaded.topology).partition("\n")
    comment = "# " if fmt is PlanFormat.shell else ""
    typer.echo(f"{head}\n{comment}{installed}\n{rest}" if installed else f"{head}\n{rest}")


@app.command()
def schema() -> None:
    """Print the JSON Schema of the topology file, for editors."""
    from .topology.model import Topology

    out = Topology.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "muse-launch topology"
    typer.echo(json.dumps(out, indent=2))


@app.command()
def init(
    hardware: str = typer.Option(..., "--hardware", help="b300 | b200 | gb300 | gb200 | h200 | mi355x | mi350x | xeon | cpu"),
    mode: str = typer.Option("pd", "--mode", help="epd | pd | agg"),
    engine: str = typer.Option("sglang", "--engine", help="sglang | vllm"),
    quant: Optional[str] = typer.Option(None, "--quant", help="nvfp4 | mxfp4 | bf16 | int4 (default: the hardware's)"),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="write here instead of stdout"),
) -> None:
    """Write a validated topology for a hardware x mode x engine x quantization, like the cookbook's panel."""
    from .init import render_init

    text = render_init(hardware, mode, engine, quant)
    if output:
        output.write_text(text)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(text, nl=False)


def _register_runtime() -> None:
    try:
        from .run import commands
    except ImportError:  # the runtime commands are being written alongside
        return
    commands.register(app)


def main(argv: list[str] | None = None) -> None:
    """click handles usage errors (exit 2), Ctrl-C and each command's exit code; we handle ours."""
    _register_runtime()
    try:
        app(args=argv)
    except UserError as exc:
        typer.echo(f"error: {exc}" if not isinstance(exc, TopologyError) else str(exc), err=True)
        sys.exit(exc.exit_code)
