"""The `doctor` command: registered on the CLI's app by cli.main."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    if not any(c.name == "doctor" for c in app.registered_commands):
        app.command("doctor")(doctor)


def doctor(
    file: Path | None = typer.Argument(None, help="topology file: also its GPUs and ports against this host"),
    as_json: bool = typer.Option(
        False, "--json", help="as JSON, with the GPU view that MUSE_LAUNCH_GPU_VIEW replays"
    ),
) -> None:
    """What this host offers: GPUs, their model, free memory and holders, engine versions, a file's ports."""
    from muse_launch.host.gpus import read_gpu_view

    from .doctor import print_doctor

    print_doctor(file, as_json, read_gpu_view, typer.echo)
