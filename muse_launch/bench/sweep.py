"""`sweep FILE --vary KEY=V1,V2 ...`: every combination of the values, each up -> bench -> down, then one
comparison of them all.

Each combination is the file with one `--set KEY=VALUE` per --vary (and the sweep's own --set), checked
before anything starts; `--dry-run` lists them with what a check says. A combination whose record holds a
summary from the same settings is not run again, so a sweep stopped half-way resumes where it was. `up`,
`bench` and `down` are this same program's commands, each in its own process: a combination that fails
to come up is recorded as failed and the sweep goes on; `down` runs whatever happened.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from muse_launch.errors import UsageError

from .measure import BenchPlan
from .run_record import SUMMARY, write_json
from .split import describe, is_split, parse_split, split_sets

SWEEP = "sweep.json"


@dataclass(frozen=True)
class SweepOptions:
    file: Path
    vary: tuple[str, ...]
    sets: tuple[str, ...]
    rehearse: bool
    dry_run: bool
    plan: BenchPlan
    out: Path
    tokenizer: str | None = None
    on: str | None = None  # `up --on NAME`: where each combination runs (default: this host)
    up_args: tuple[str, ...] = ()  # more of `up`'s options, as given (--up-arg=--partition=debug)
    pick: Path | None = None  # --pick OUT.yaml: the variant with the most goodput per GPU inside the SLO


def parse_vary(vary: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    axes = []
    for item in vary:
        key, eq, values = item.partition("=")
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not key.strip() or not options:
            raise UsageError(
                f"--vary {item!r}: expected KEY=V1,V2", fix="e.g. --vary roles.decode.replicas=1,2"
            )
        if any(k == key.strip() for k, _ in axes):
            raise UsageError(f"--vary {key.strip()} given twice", fix="list all its values in one --vary")
        axes.append((key.strip(), options))
    if not axes:
        raise UsageError(
            "sweep needs at least one --vary KEY=V1,V2", fix="e.g. --vary roles.decode.replicas=1,2"
        )
    return axes


def combinations(axes: list[tuple[str, list[str]]]) -> list[tuple[str, ...]]:
    keys = [k for k, _ in axes]
    return [
        tuple(f"{k}={v}" for k, v in zip(keys, values, strict=True))
        for values in itertools.product(*(v for _, v in axes))
    ]


def slug(combo: tuple[str, ...]) -> str:
    text = "_".join(s.split(".")[-1] if "." in s.split("=")[0] else s for s in combo)
    return re.sub(r"[^A-Za-z0-9=._-]+", "-", text)[:120] or "default"


def combo_sets(opts: SweepOptions, combo: tuple[str, ...]) -> list[str]:
    """The `--set` assignments that make this combination: the sweep's own, then each --vary value, a
    `split=P:D` written out as the two roles' replicas and GPUs (muse_launch/bench/split.py). A split that
    does not fit the host is a UsageError."""
    plain = [*opts.sets, *(c for c in combo if not is_split(c))]
    splits = [parse_split(c.partition("=")[2]) for c in combo if is_split(c)]
    if not splits:
        return plain
    from muse_launch.errors import UserError
    from muse_launch.topology.load import load_topology

    try:
        topology = load_topology(opts.file, plain).topology
    except UsageError:
        raise
    except UserError:  # the file does not load: its check says why, where the combination is listed
        return plain
    return plain + [s for split in splits for s in split_sets(topology, split)]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "muse_launch", *args]


def deployment_name(opts: SweepOptions, combo: tuple[str, ...]) -> tuple[str | None, str]:
    """The deployment's name for this combination, or None and why it does not check."""
    from muse_launch.core import load_plan
    from muse_launch.errors import UserError

    try:
        return load_plan(opts.file, combo_sets(opts, combo), rehearse=opts.rehearse).plan.name, "checks"
    except UserError as exc:
        return None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def done_before(run: Path, combo: tuple[str, ...], opts: SweepOptions) -> bool:
    """Whether this combination has a VALID record of the same settings: an invalid one is run again."""
    try:
        summary = json.loads((run / SUMMARY).read_text())
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(summary, dict)
        and summary.get("sweep") == sweep_key(combo, opts)
        and summary.get("valid") is True
    )


def set_aside(run: Path) -> Path | None:
    """An earlier, not reusable attempt of a combination moved to RUN.before-<time>, so that the new run's
    record is not mixed with its points; where it went (None: there was none)."""
    if not run.exists():
        return None
    aside = run.with_name(f"{run.name}.before-{time.strftime('%Y%m%d-%H%M%S')}")
    n = 1
    while aside.exists():
        n += 1
        aside = run.with_name(f"{run.name}.before-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
    run.rename(aside)
    return aside


def sweep_key(combo: tuple[str, ...], opts: SweepOptions) -> dict:
    p = opts.plan
    return {
        "file": str(opts.file.resolve()),
        "sets": [*opts.sets, *combo],
        "rehearse": opts.rehearse,
        "concurrency": list(p.concurrencies),
        "isl": p.isl,
        "osl": p.osl,
        "requests": p.requests,
        "duration_s": p.duration,
        "slo": p.slo.as_dict() if p.slo else None,
    }


def timed(argv: list[str], echo: Callable[[str], None], log: Path) -> tuple[int, float]:
    start = time.monotonic()
    with open(log, "ab") as f:
        code = subprocess.call(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return code, time.monotonic() - start


def run_one(
    opts: SweepOptions, combo: tuple[str, ...], name: str, run: Path, echo: Callable[[str], None]
) -> dict:
    run.mkdir(parents=True, exist_ok=True)
    log = run / "sweep.log"
    sets = [a for s in combo_sets(opts, combo) for a in ("--set", s)]
    where = ["--on", opts.on] if opts.on else []
    rehearse = ["--rehearse"] if opts.rehearse else []
    up = _cli("up", str(opts.file), "-d", *sets, *rehearse, *where, *opts.up_args)
    p = opts.plan
    bench = _cli(
        "bench",
        name,
        "--out",
        str(run),
        "--concurrency",
        ",".join(map(str, p.concurrencies)),
        "--isl",
        str(p.isl),
        "--osl",
        str(p.osl),
        "--duration",
        f"{p.duration:g}",
        *(["--requests", str(p.requests)] if p.requests else []),
        *(["--tokenizer", opts.tokenizer] if opts.tokenizer else []),
        *(["--slo", p.slo.argument()] if p.slo else []),
    )
    times = {"up_s": 0.0, "bench_s": 0.0, "down_s": 0.0}
    code_up, times["up_s"] = timed(up, echo, log)
    code_bench = None
    try:
        if code_up == 0:
            code_bench, times["bench_s"] = timed(bench, echo, log)
    finally:
        code_down, times["down_s"] = timed(_cli("down", name), echo, log)
    state = (
        "up failed"
        if code_up
        else "bench failed"
        if code_bench not in (0, 1)
        else "invalid"
        if code_bench == 1
        else "valid"
    )
    if code_down:
        state += ", down failed"
    summary_path = run / SUMMARY
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        summary["sweep"] = sweep_key(combo, opts)
        write_json(summary_path, summary)
    return {
        "combination": list(combo),
        "run": str(run),
        "state": state,
        **{k: round(v, 2) for k, v in times.items()},
        "_seconds": sum(times.values()),  # unrounded, for the sweep's sum (not written)
    }


def run_sweep(opts: SweepOptions, echo: Callable[[str], None]) -> int:
    combos = combinations(parse_vary(opts.vary))
    for combo in combos:  # a split that does not fit the host stops the sweep before anything starts
        combo_sets(opts, combo)
    names = [deployment_name(opts, c) for c in combos]
    echo(f"sweep {opts.file}: {len(combos)} combination(s){' (rehearsal)' if opts.rehearse else ''}")
    for i, (combo, (name, why)) in enumerate(zip(combos, names, strict=True), 1):
        run = opts.out / slug(combo)
        mark = "done" if done_before(run, combo, opts) else "to run" if name else "does not check"
        echo(f"  {i}. {' '.join(combo)}  -> {run}  [{mark}{'' if name else ': ' + why}]")
        if any(is_split(c) for c in combo):
            split = [s for s in combo_sets(opts, combo) if s not in opts.sets and s not in combo]
            echo(f"       {describe(split)}")
    if opts.dry_run:
        return 0
    opts.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = []
    for combo, (name, why) in zip(combos, names, strict=True):
        run = opts.out / slug(combo)
        if name is None:
            results.append({"combination": list(combo), "run": str(run), "state": f"does not check: {why}"})
        elif done_before(run, combo, opts):
            results.append({"combination": list(combo), "run": str(run), "state": "done before"})
        else:
            aside = set_aside(run)
            if aside:
                echo(f"sweep: {' '.join(combo)}: its earlier attempt moved to {aside}")
            echo(f"sweep: {' '.join(combo)}: up -> bench -> down (log {run / 'sweep.log'})")
            results.append(run_one(opts, combo, name, run, echo))
        echo(f"  {' '.join(combo)}: {results[-1]['state']}")
    return finish(opts, results, time.monotonic() - started, echo)


def finish(opts: SweepOptions, results: list[dict], wall: float, echo: Callable[[str], None]) -> int:
    # from the unrounded times: a sum of rounded parts can pass the wall time they were measured in
    parts = sum(
        r.pop("_seconds", r.get("up_s", 0) + r.get("bench_s", 0) + r.get("down_s", 0)) for r in results
    )
    write_json(
        opts.out / SWEEP,
        {
            "file": str(opts.file),
            "results": results,
            "wall_s": round(wall, 2),
            "sum_of_parts_s": round(parts, 2),
        },
    )
    echo(f"sweep: {wall:.1f} s in all, {parts:.1f} s of up, bench and down ({wall - parts:+.1f} s besides)")
    recorded = [Path(r["run"]) for r in results if (Path(r["run"]) / SUMMARY).exists()]
    if len(recorded) >= 2:
        from .compare import compare_runs

        compare_runs(recorded, opts.out / "compare", echo)
    bad = [r for r in results if r["state"] not in ("valid", "done before")]
    picked = pick_variant(opts, results, echo) if opts.pick else 0
    return 1 if bad or picked else 0


def best_goodput(summary: dict) -> tuple[float, int] | None:
    """The most output tokens/s per GPU inside the SLO over the points that meet it (total tok/s on a
    deployment without GPUs), and at which concurrency; None where no point meets the SLO."""
    best = None
    for p in summary["points"]:
        g = p.get("goodput")
        if not isinstance(g, dict) or not g.get("meets_slo"):
            continue
        v = g.get("output_tokens_per_s_per_gpu")
        v = g.get("output_tokens_per_s") if v is None else v
        if isinstance(v, int | float) and (best is None or v > best[0]):
            best = (float(v), p["concurrency"])
    return best


def variant_text(opts: SweepOptions, combo: tuple[str, ...]) -> str:
    """The topology file with this combination's --set (and the sweep's own) written in."""
    import yaml

    from muse_launch.topology.load import _apply_set

    data = yaml.safe_load(opts.file.read_text())
    for assignment in combo_sets(opts, combo):
        problem = _apply_set(data, assignment)
        if problem:
            raise UsageError(problem)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def pick_variant(opts: SweepOptions, results: list[dict], echo: Callable[[str], None]) -> int:
    """Write --pick OUT.yaml: the valid variant with the most goodput per GPU; 1 where none meets the SLO."""
    from .report import slo_text
    from .run_record import read_summary

    assert opts.pick is not None
    if opts.plan.slo is None:
        raise UsageError(
            "sweep --pick needs --slo: goodput is counted against it", fix="e.g. --slo ttft=500ms,itl=50ms"
        )
    rows, best = [], None
    for r in results:
        combo = tuple(r["combination"])
        try:
            summary = read_summary(Path(r["run"]))
        except ValueError:
            rows.append((combo, "no record", None))
            continue
        found = best_goodput(summary) if summary.get("valid") else None
        verdict = summary.get("verdict") or ("valid" if summary.get("valid") else "invalid")
        rows.append((combo, verdict, found))
        if found and (best is None or found[0] > best[1][0]):
            best = (combo, found)
    slo = slo_text(opts.plan.slo.as_dict())
    table = [f"sweep of {opts.file.name}: goodput (output tokens/s per GPU inside {slo})"]
    for combo, verdict, found in rows:
        figure = f"{found[0]:.1f} at concurrency {found[1]}" if found else "none meets the SLO"
        table.append(f"  {' '.join(combo)}: {figure} [{verdict}]")
    for line in table:
        echo(line)
    if best is None:
        echo(f"sweep --pick: no variant meets the SLO ({slo}); {opts.pick} not written")
        return 1
    combo, (value, conc) = best
    header = [
        f"# picked by `muse-launch sweep --pick`: {' '.join(combo)}, the most goodput per GPU "
        f"({value:.1f} output tokens/s per GPU at concurrency {conc})",
        f"# ISL {opts.plan.isl}, OSL {opts.plan.osl}"
        + (" (rehearsal: simulated timing)" if opts.rehearse else ""),
        *(f"# {line}" for line in table),
    ]
    opts.pick.write_text("\n".join(header) + "\n" + variant_text(opts, combo))
    echo(f"sweep --pick: {opts.pick} is {' '.join(combo)} ({value:.1f} tok/s per GPU inside the SLO)")
    return 0
