"""`muse-launch autoscale NAME`: the autoscaler in the foreground, reading its roles' metrics as `top` does
and printing what it would do and why (docs/autoscale.md); `--advise` for any deployment. On Kubernetes,
where no supervisor runs it, it also acts (the file's `mode: act`) through the same change as `scale`."""

from __future__ import annotations

import typer


def autoscale(
    name: str | None = typer.Argument(
        None, help="deployment name or topology file (default: the one running)"
    ),
    advise: bool = typer.Option(
        False,
        "--advise",
        help="only say and record what it would do (on one host and SLURM the supervisor acts where the file "
        "says act; on Kubernetes this command acts without --advise)",
    ),
    file: str | None = typer.Option(
        None, "--file", help="the topology file whose autoscale: block to use (default: the one it came from)"
    ),
    interval: float | None = typer.Option(None, "--interval", min=0.2, help="seconds between decisions"),
    steps: int | None = typer.Option(None, "--steps", min=1, help="decide this many times, then exit"),
    kubeconfig: str | None = typer.Option(
        None,
        "--kubeconfig",
        help="Kubernetes: the credentials it reads and acts with, e.g. its ServiceAccount's token (default: "
        "those `up` recorded)",
    ),
) -> None:
    """Decide every interval, for each scaled role, the next change that keeps the latency targets with the
    fewest GPUs; each decision is printed and appended to decisions.jsonl in the run directory."""
    import threading

    from muse_launch.backends import backend_of
    from muse_launch.errors import UsageError
    from muse_launch.rundir.state import K8S, read_state, resolve_name
    from muse_launch.supervise.autoscaler import Autoscaler, Setup, loop
    from muse_launch.top.deadline import bounded_client
    from muse_launch.topology.load import load_topology

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
    act = None
    if not advise:
        if backend.name != K8S:
            raise UsageError(
                f"{run_dir.name} runs on {backend.name}: its supervisor acts there; this command advises",
                fix=f"`muse-launch autoscale {run_dir.name} --advise`; to act, set "
                "`autoscale: {mode: act}` in the file",
            )
        act = acting_through(backend, run_dir)
    if kubeconfig is not None:
        if backend.name != K8S:
            raise UsageError(f"--kubeconfig: {run_dir.name} does not run on Kubernetes")
        from muse_launch.k8s.cluster_ops import ACTING_AS

        ACTING_AS["kubeconfig"] = kubeconfig

    def current():
        now = read_state(run_dir)
        return backend.observe(now) if now is not None else None

    auto = Autoscaler(setup, run_dir, act, typer.echo, verbose=True)
    doing = "acting" if auto.mode == "act" else "advising"
    typer.echo(
        f"autoscale {run_dir.name}: {doing} every {interval or setup.config.interval:g}s from {source}; "
        "Ctrl-C ends it"
    )
    try:
        with bounded_client(3.0) as client:
            loop(auto, current, threading.Event(), client, interval=interval, steps=steps)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def acting_through(backend, run_dir):
    """A decision made as `scale` makes it: the backend's change (Kubernetes: the objects' replicas, a new pod
    registered once ready, a leaving one taken out and drained)."""
    from muse_launch.change import ScaleRole

    def act(role: str, replicas: int, why: str) -> int:
        result = backend.change(run_dir, ScaleRole(role, replicas, why), lambda text: typer.echo(f"  {text}"))
        instances = result.get("instances")
        return len(instances) if isinstance(instances, list) else replicas

    return act


def register(app: typer.Typer) -> None:
    app.command()(autoscale)
