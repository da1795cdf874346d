"""The commands about a topology file before anything runs: validate, plan, schema and init. Thin: parse,
call the core, print; each imports what it needs when it runs (`--help` stays fast)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from muse_launch.errors import TopologyError


class PlanFormat(str, Enum):
    text = "text"
    json = "json"
    shell = "shell"
    docker = "docker"
    sbatch = "sbatch"
    mermaid = "mermaid"
    dot = "dot"


def validate(
    file: Path = typer.Argument(..., help="topology file"),
    strict: bool = typer.Option(False, "--strict", help="warnings fail too"),
    as_json: bool = typer.Option(False, "--json", help="findings as JSON, for tools"),
    set_: list[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
    engine_check: bool = typer.Option(
        False,
        "--engine-check",
        help="parse each command with the installed engine's and router's own parser too (what `up` does)",
    ),
) -> None:
    """Check a topology against the hardware and itself before anything starts."""
    import json

    from muse_launch.checks import Severity
    from muse_launch.core import check_file

    try:
        loaded, findings, plan = check_file(file, set_)
    except TopologyError as exc:
        if not as_json:
            raise
        typer.echo(
            json.dumps(
                {
                    "file": str(file),
                    "ok": False,
                    "errors": exc.problems,
                    **({"fix": exc.fix} if exc.fix else {}),
                },
                indent=2,
            )
        )
        raise typer.Exit(exc.exit_code) from None
    if engine_check and plan is not None:
        from muse_launch.checks.engine import check

        result = check(plan, loaded)
        findings += result.findings
        for note in result.notes:
            typer.echo(loaded.redact(note), err=True)
    failed = any(f.severity is Severity.ERROR or strict for f in findings)
    if as_json:
        report = {"file": str(file), "ok": not failed, "findings": [f.to_dict(loaded) for f in findings]}
        typer.echo(json.dumps(redact_all(report, loaded.redact), indent=2))
    else:
        for f in findings:
            typer.echo(loaded.redact(f.format(loaded)), err=True)
        errors = sum(f.severity is Severity.ERROR for f in findings)
        warnings = len(findings) - errors
        verdict = "FAILED" if failed else "ok"
        typer.echo(
            f"{file}: {verdict} ({len(loaded.topology.roles)} roles, {errors} errors, {warnings} warnings)"
        )
    raise typer.Exit(1 if failed else 0)


def plan(
    file: Path = typer.Argument(..., help="topology file"),
    fmt: PlanFormat = typer.Option(
        PlanFormat.text, "--format", "-f", help="text | json | shell | docker | sbatch | mermaid | dot"
    ),
    rehearse: bool = typer.Option(False, "--rehearse", help="the plan `up --rehearse` would run"),
    set_: list[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
) -> None:
    """Show each role's exact argv, env, GPUs, ports and probe, in start order."""
    import json

    from muse_launch import render_graph, render_text
    from muse_launch.core import load_plan

    loaded_plan = load_plan(file, set_, rehearse=rehearse)
    for f in loaded_plan.findings:
        typer.echo(loaded_plan.redact(f.format(loaded_plan.loaded)), err=True)
    installed = ""
    if not rehearse and fmt in (PlanFormat.text, PlanFormat.shell):
        from muse_launch.checks.versions import installed_here

        installed = installed_here(
            loaded_plan.plan, loaded_plan.loaded, lambda line: typer.echo(line, err=True)
        )
    from muse_launch.host.versions import engine_versions
    from muse_launch.plan.compose import compose

    policy = compose(loaded_plan.loaded.topology, rehearse=rehearse, versions=engine_versions).policy
    if policy.note and fmt is PlanFormat.text:
        typer.echo(policy.note, err=True)  # why, where the versions decide it
    renderers = {
        PlanFormat.text: lambda p, r, t: render_text.plan_text(
            policy.plan, r, t, policy.policy, policy.start_after
        ),
        PlanFormat.json: lambda p, r, t: json.dumps(
            redact_all(
                {
                    **policy.plan.to_dict(r),
                    "start": {
                        "policy": policy.policy,
                        "after": {k: list(v) for k, v in policy.start_after.items()},
                    },
                },
                r,
            ),
            indent=2,
        ),
        PlanFormat.shell: render_text.plan_shell,
        PlanFormat.docker: render_text.plan_docker,
        PlanFormat.sbatch: lambda p, r, t: _sbatch_script(p, t, rehearse, set_),
        PlanFormat.mermaid: lambda p, r, t: render_graph.plan_mermaid(p, r, t.start),
        PlanFormat.dot: lambda p, r, t: render_graph.plan_dot(p, r, t.start),
    }
    # Every rendering (comments, URLs, probe paths too) with `${env:...}` values hidden once more as a whole.
    rendered = renderers[fmt](loaded_plan.plan, loaded_plan.redact, loaded_plan.loaded.topology)
    head, _, rest = (rendered if fmt is PlanFormat.json else loaded_plan.redact(rendered)).partition("\n")
    installed = render_text.comment(installed) if fmt is PlanFormat.shell else installed  # one comment line
    typer.echo(f"{head}\n{installed}\n{rest}" if installed else f"{head}\n{rest}")


def redact_all(value, redact):
    """Each string in a JSON value redacted (a probe path, a host from `${env:...}`), before it is encoded."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact_all(k, redact): redact_all(v, redact) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_all(v, redact) for v in value]
    return value


def _sbatch_script(plan, topology, rehearse: bool, sets: list[str]) -> str:
    from muse_launch.slurm.up import sbatch_script

    return sbatch_script(plan, topology, rehearse, sets)


def schema_document() -> dict:
    """The JSON Schema of the topology file, as `schema` prints it."""
    from muse_launch.topology.model import Topology

    out = Topology.model_json_schema()
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "muse-launch topology"
    return out


def schema() -> None:
    """Print the JSON Schema of the topology file, for editors."""
    import json

    typer.echo(json.dumps(schema_document(), indent=2))


def init(
    hardware: str = typer.Option(
        ..., "--hardware", help="b300 | b200 | gb300 | gb200 | h200 | mi355x | mi350x | xeon | cpu"
    ),
    mode: str = typer.Option("pd", "--mode", help="epd | pd | agg"),
    engine: str = typer.Option("sglang", "--engine", help="sglang | vllm"),
    quant: str | None = typer.Option(
        None, "--quant", help="nvfp4 | mxfp4 | bf16 | int4 (default: the hardware's)"
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="write here instead of stdout"),
    force: bool = typer.Option(False, "--force", help="replace the --output file if it exists"),
) -> None:
    """Write a validated topology for a hardware x mode x engine x quantization, like the cookbook's panel."""
    import shlex

    from muse_launch.errors import UsageError
    from muse_launch.init import render_init

    text = render_init(hardware, mode, engine, quant)
    if output and output.exists() and not force:  # a file edited by hand is not replaced without a word
        again = ["muse-launch", "init", "--hardware", hardware, "--mode", mode, "--engine", engine]
        again += ["--quant", quant] if quant else []
        raise UsageError(
            f"{output} exists; init does not replace it",
            fix=f"`{shlex.join([*again, '-o', str(output), '--force'])}` replaces it, or give another -o",
        )
    if output:
        output.write_text(text)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(plan)
    app.command()(schema)
    app.command()(init)
