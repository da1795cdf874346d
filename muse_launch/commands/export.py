"""The `export` command: registered on the CLI's app by cli.main."""

from __future__ import annotations

from pathlib import Path

import typer

from muse_launch.export.names import DNS_LABEL

from ..errors import UsageError


def register(app: typer.Typer) -> None:
    if not any(c.name == "export" for c in app.registered_commands):
        app.command("export")(export_command)


def export_command(
    file: Path | None = typer.Argument(None, help="topology file"),
    to: str = typer.Option("lws", "--to", help="lws (LeaderWorkerSet, default) | rbg (RoleBasedGroup)"),
    output: Path | None = typer.Option(None, "--output", "-o", help="directory to write the manifests into"),
    image: list[str] = typer.Option(
        [],
        "--image",
        help="IMAGE for every role, or ROLE=IMAGE (repeatable); "
        "default: the hardware profile's, as plan --format docker",
    ),
    namespace: str = typer.Option(
        "default", "--namespace", "-n", help="namespace (the wiring's DNS names include it)"
    ),
    set_: list[str] = typer.Option([], "--set", help="override a key: roles.prefill.mem_fraction=0.75"),
    check: Path | None = typer.Option(
        None, "--check", help="validate the manifests in DIR instead (hand edits)"
    ),
    server: bool = typer.Option(
        False,
        "--server",
        help="with --check: ask the cluster's API server (a server-side "
        "dry run with strict field validation, its webhooks, each pod template as a pod)",
    ),
    context: str | None = typer.Option(None, "--context", help="with --server: the kubeconfig context"),
) -> None:
    """Write Kubernetes manifests (LeaderWorkerSet or RoleBasedGroup) that run the topology's plan."""
    if check is not None:
        if file is not None or output is not None:
            raise UsageError("--check DIR validates a directory: give no FILE or -o with it")
        raise typer.Exit(_check_server(check, namespace, context) if server else _check(check))
    if server or context:
        raise UsageError("--server and --context go with --check DIR")
    if file is None or output is None:
        raise UsageError("give a topology FILE and -o DIR (or --check DIR)")
    from muse_launch.export import FLAVOURS, export

    if to not in FLAVOURS:
        raise UsageError(f"--to {to}: one of {', '.join(FLAVOURS)}")
    if not DNS_LABEL.match(namespace) or len(namespace) > 63:
        raise UsageError(
            f"--namespace {namespace}: a namespace is a DNS label (lowercase letters, digits, '-')"
        )
    images = {}
    for value in image:
        role, sep, name = value.partition("=")
        images[role if sep else ""] = name if sep else value
    done = export(file, output, to, namespace, images, set_)
    for warning in done.export.warnings:
        typer.echo(warning, err=True)
    if done.problems:
        for problem in done.problems:
            typer.echo(problem.format(output), err=True)
        typer.echo(
            f"{file}: FAILED: {len(done.problems)} problems in the manifests; nothing written", err=True
        )
        raise typer.Exit(1)
    objects = sum(len(f.objects) for f in done.files)
    typer.echo(f"{file}: wrote {objects} objects in {len(done.files)} files to {output} ({to})")
    for f in done.files:
        typer.echo(f"  {output / f.path}")
    gpus = sum(len(s.gpus) for s in done.export.plan.specs)
    if gpus:
        typer.echo(
            f"GPUs: {gpus} in {len(done.export.plan.specs)} pods (each pod its own; roles that share GPUs "
            f"on one host do not share them here)"
        )
    if done.export.secrets:
        names = done.export.names
        typer.echo(
            f"secrets: the pods read {', '.join(done.export.secrets)} from Secret {names.secret}; create it "
            f"first: kubectl -n {names.namespace} create secret generic {names.secret} "
            + " ".join(f"--from-literal={n}=..." for n in done.export.secrets)
        )


def _check_server(directory: Path, namespace: str, context: str | None) -> int:
    from muse_launch.export.validate import read_dir
    from muse_launch.k8s.apply import server_problems
    from muse_launch.k8s.client import connect

    if not directory.is_dir():
        raise UsageError(f"--check {directory}: not a directory")
    docs, unreadable = read_dir(directory)
    for problem in unreadable:
        typer.echo(problem.format(directory), err=True)
    if unreadable:
        typer.echo(f"{directory}: FAILED: a file does not read as YAML", err=True)
        return 2
    cluster = connect(context)
    try:
        problems = server_problems(cluster, docs, namespace)
    finally:
        cluster.close()
    for problem in problems:
        typer.echo(problem.format(directory), err=True)
    where = f"the API server at {cluster.server} (context {cluster.context}, dry run)"
    if problems:
        typer.echo(
            f"{directory}: FAILED ({len(problems)} problem{'s' if len(problems) != 1 else ''}; {where})",
            err=True,
        )
        return 1
    objects = sum(1 for _, doc in docs if not (isinstance(doc, dict) and doc.get("kind") == "Kustomization"))
    typer.echo(f"{directory}: ok ({objects} objects accepted by {where})")
    return 0


def _check(directory: Path) -> int:
    from muse_launch.export.validate import check_dir_problems

    if not directory.is_dir():
        raise UsageError(f"--check {directory}: not a directory")
    problems, unreadable = check_dir_problems(directory)
    for problem in problems:
        typer.echo(problem.format(directory), err=True)
    if unreadable:
        typer.echo(f"{directory}: FAILED: a file does not read as YAML", err=True)
        return 2
    if problems:
        typer.echo(
            f"{directory}: FAILED ({len(problems)} problem{'s' if len(problems) != 1 else ''})", err=True
        )
        return 1
    typer.echo(f"{directory}: ok")
    return 0
