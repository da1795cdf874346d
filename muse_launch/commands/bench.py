"""The `bench` and `sweep` commands: registered on the CLI's app by cli.main. Thin: parse, call, print.

`bench compare RUN RUN...` is `bench` whose first argument is `compare` (a deployment cannot be named
so when comparing; `bench NAME` measures one called anything else).
"""

from __future__ import annotations

from pathlib import Path

import typer


def _ints(text: str, what: str) -> tuple[int, ...]:
    from muse_launch.errors import UsageError

    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise UsageError(
            f"{what} {text!r}: expected positive integers separated by commas", fix=f"e.g. {what} 1,4,16"
        )
    return tuple(sorted(set(values)))


def bench(
    name: str | None = typer.Argument(None, help="deployment (default: the one running), or `compare`"),
    runs: list[Path] | None = typer.Argument(None, help="with `compare`: the run directories to compare"),
    concurrency: str = typer.Option(
        "1,4,16", "--concurrency", "-c", help="concurrent requests, one point each"
    ),
    isl: int = typer.Option(512, "--isl", min=1, help="input tokens per request"),
    osl: int = typer.Option(128, "--osl", min=1, help="output tokens per request (ignore_eos is sent)"),
    requests: int | None = typer.Option(
        None, "--requests", "-n", min=1, help="requests per point (default: 8 x concurrency, at least 16)"
    ),
    duration: float = typer.Option(
        120.0, "--duration", min=1.0, max=86400.0, help="seconds per point, at most"
    ),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="record directory (default: the run directory's bench/<time>)"
    ),
    tokenizer: Path | None = typer.Option(
        None, "--tokenizer", help="the model's local directory (default: the one the workers report)"
    ),
    model: str | None = typer.Option(
        None, "--model", help="model name to request (default: as the router lists)"
    ),
    check_equivalence: str | None = typer.Option(
        None,
        "--check-equivalence",
        metavar="REF",
        help="send the same prompts greedily to this deployment and to REF; fail when an answer differs",
    ),
    prompts: int = typer.Option(
        8, "--prompts", min=1, max=1000, help="with --check-equivalence: how many prompts"
    ),
    seed: int = typer.Option(0, "--seed", help="aiperf's random seed: the same prompts run after run"),
    slo: str | None = typer.Option(
        None,
        "--slo",
        help="latency targets for goodput, e.g. ttft=500ms,itl=50ms[,e2e=10s][,attain=90%]",
    ),
) -> None:
    """Measure a deployment through its router with aiperf, judge the run valid, and record it
    (docs/bench.md)."""
    if name == "compare":
        from muse_launch.bench.compare import compare_runs

        raise typer.Exit(compare_runs(list(runs or []), out, typer.echo))
    if runs:
        from muse_launch.errors import UsageError

        raise UsageError(
            f"bench takes one deployment; {' '.join(map(str, runs))} is more",
            fix="`muse-launch bench compare RUN RUN...` compares recorded runs",
        )
    from muse_launch.backends import backend_of
    from muse_launch.bench.measure import parse_slo
    from muse_launch.bench.target import target_of

    targets = parse_slo(slo) if slo else None  # a bad --slo is said before anything is contacted

    record, run_dir = _deployment(name)
    tokenizer_dir = str(tokenizer) if tokenizer else None
    target = target_of(record, tokenizer_dir, model, typer.echo, backend_of(run_dir).observe)
    if check_equivalence is not None:
        from muse_launch.bench.equivalence import check_against

        ref_record, ref_dir = _deployment(check_equivalence)
        reference = target_of(ref_record, tokenizer_dir, model, typer.echo, backend_of(ref_dir).observe)
        raise typer.Exit(check_against(target, reference, prompts, osl, typer.echo))
    from muse_launch.bench.measure import BenchPlan, run_bench

    plan = BenchPlan(_ints(concurrency, "--concurrency"), isl, osl, requests, duration, seed, targets)
    summary = run_bench(target, plan, out or default_out(run_dir), typer.echo)
    raise typer.Exit(0 if summary["valid"] else 1)


def default_out(run_dir) -> Path:
    import time

    return run_dir.path / "bench" / time.strftime("%Y%m%d-%H%M%S")


def _deployment(name: str | None):
    from muse_launch.errors import RuntimeFailure
    from muse_launch.rundir.state import read_state, resolve_name

    run_dir = resolve_name(name)
    record = read_state(run_dir)
    if record is None:
        raise RuntimeFailure(
            f"deployment {run_dir.name!r} has no state ({run_dir.state_file} is gone)",
            fix="bring it up with `muse-launch up FILE -d`",
        )
    return record, run_dir


def sweep(
    file: Path = typer.Argument(..., help="topology file"),
    vary: list[str] = typer.Option(
        [],
        "--vary",
        help="KEY=V1,V2: one value of each --vary per combination, e.g. roles.decode.replicas=1,2",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="list the combinations and stop"),
    rehearse: bool = typer.Option(False, "--rehearse", help="simulated engines in place of GPU ones"),
    set_: list[str] = typer.Option([], "--set", help="a key set for every combination"),
    concurrency: str = typer.Option("1,4,16", "--concurrency", "-c"),
    isl: int = typer.Option(512, "--isl", min=1),
    osl: int = typer.Option(128, "--osl", min=1),
    requests: int | None = typer.Option(None, "--requests", "-n", min=1),
    duration: float = typer.Option(120.0, "--duration", min=1.0, max=86400.0),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="sweep directory (default: ./sweep-<file name>)"
    ),
    tokenizer: Path | None = typer.Option(None, "--tokenizer"),
    on: str | None = typer.Option(
        None, "--on", help="where each combination runs: slurm | k8s (as `up --on`)"
    ),
    up_arg: list[str] = typer.Option(
        [], "--up-arg", help="one more option for each `up`, e.g. --up-arg=--partition=debug"
    ),
    slo: str | None = typer.Option(
        None, "--slo", help="latency targets for goodput, e.g. ttft=500ms,itl=50ms (as bench --slo)"
    ),
    pick: Path | None = typer.Option(
        None, "--pick", help="write the variant with the most goodput per GPU inside --slo to this file"
    ),
) -> None:
    """Every combination of the --vary values: up -> bench -> down, then one comparison (docs/bench.md)."""
    from muse_launch.bench.measure import BenchPlan, parse_slo
    from muse_launch.bench.sweep import SweepOptions, run_sweep
    from muse_launch.errors import UsageError

    if pick is not None and not slo:
        raise UsageError(
            "sweep --pick needs --slo: goodput is counted against it", fix="e.g. --slo ttft=500ms,itl=50ms"
        )
    targets = parse_slo(slo) if slo else None
    plan = BenchPlan(_ints(concurrency, "--concurrency"), isl, osl, requests, duration, slo=targets)
    options = SweepOptions(
        file,
        tuple(vary),
        tuple(set_),
        rehearse,
        dry_run,
        plan,
        out or Path(f"sweep-{file.stem}"),
        str(tokenizer) if tokenizer else None,
        on,
        tuple(up_arg),
        pick,
    )
    raise typer.Exit(run_sweep(options, typer.echo))


def register(app: typer.Typer) -> None:
    for command in (bench, sweep):
        if not any(c.name == command.__name__ for c in app.registered_commands):
            app.command(command.__name__)(command)
