"""`bench`: every point of the plan, one aiperf run each, then the gate, the record and the report.

A point is bounded twice: aiperf stops at --requests or --duration, whichever comes first, and the
point is stopped at duration + a grace if aiperf itself does not end. The engines' generation counters
are read before and after each point, so the client's token count can be checked against theirs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from muse_launch.top.deadline import bounded_client

from . import aiperf as ap
from .gate import PointFigures, judge_point
from .target import Target, generated_tokens

SATURATED_PCT = 90.0  # the client machine's CPU busy share past which its figures are the client's limit


@dataclass(frozen=True)
class BenchPlan:
    concurrencies: tuple[int, ...]
    isl: int
    osl: int
    requests: int | None  # per point; None: 8 x concurrency, at least 16
    duration: float  # seconds per point
    seed: int = 0
    slo: Slo | None = None  # --slo: the latency targets goodput counts against

    def requests_at(self, concurrency: int) -> int:
        return self.requests or max(16, 8 * concurrency)


@dataclass(frozen=True)
class Slo:
    """`--slo ttft=500ms,itl=50ms[,e2e=10s][,attain=90%]`: a request is good when it meets every target (its
    TTFT, its mean ITL, its whole latency); a point meets the SLO when at least `attain` % of its requests are
    good (DistServe's SLO attainment: 90% by default, i.e. the targets hold at p90)."""

    targets_ms: tuple[tuple[str, float], ...]
    attain_pct: float = 90.0

    def text(self) -> str:
        parts = [f"{k}<={v:g}ms" for k, v in self.targets_ms]
        return ", ".join(parts) + f" for {self.attain_pct:g}% of requests"

    def as_dict(self) -> dict:
        return {"targets_ms": dict(self.targets_ms), "attain_pct": self.attain_pct}

    def argument(self) -> str:
        """As `--slo` takes it (for each `bench` of a sweep)."""
        return ",".join(f"{k}={v:g}ms" for k, v in self.targets_ms) + f",attain={self.attain_pct:g}%"


_UNITS = {"ms": 1.0, "s": 1000.0, "us": 0.001}


def parse_slo(text: str) -> Slo:
    from muse_launch.errors import UsageError

    fix = "e.g. --slo ttft=500ms,itl=50ms (targets: ttft, itl, e2e; attain=90% by default)"
    targets: dict[str, float] = {}
    attain = 90.0
    for item in (i.strip() for i in text.split(",")):
        key, eq, value = item.partition("=")
        key, value = key.strip().lower(), value.strip().lower()
        try:
            if not eq:
                raise ValueError
            if key == "attain":
                attain = float(value.rstrip("%"))
                if not 0 < attain <= 100:
                    raise ValueError
                continue
            if key not in ap.LATENCIES or key in targets:
                raise ValueError
            unit = next((u for u in ("ms", "us", "s") if value.endswith(u)), "ms")
            number = float(value[: len(value) - len(unit)] if value.endswith(unit) else value)
            if not 0 < number < float("inf"):
                raise ValueError
            targets[key] = number * _UNITS[unit]
        except ValueError:
            raise UsageError(f"--slo {text!r}: {item!r} is not a target", fix=fix) from None
    if not targets:
        raise UsageError(f"--slo {text!r}: no latency target", fix=fix)
    return Slo(tuple(targets.items()), attain)


def goodput(
    slo: Slo, requests: list[dict], requests_per_s: float, tokens_per_s: float, gpus: int | None
) -> dict:
    """Requests that met every target, and requests/s and output tokens/s of those only (per GPU too): the
    point's own throughput (aiperf's, over its window) times the good requests' share of requests and of
    output tokens, so that goodput is never more than the raw figure beside it."""
    good = [r for r in requests if all(r.get(k) is not None and r[k] <= v for k, v in slo.targets_ms)]
    all_tokens = sum(r.get("tokens", 0.0) for r in requests)
    share = len(good) / len(requests) if requests else 0.0
    token_share = sum(r.get("tokens", 0.0) for r in good) / all_tokens if all_tokens > 0 else share
    rps, tps = requests_per_s * share, tokens_per_s * token_share
    return {
        "slo": slo.as_dict(),
        "requests_measured": len(requests),
        "requests_good": len(good),
        "attained_pct": round(100.0 * share, 2),
        "meets_slo": bool(requests) and 100.0 * share >= slo.attain_pct,
        "requests_per_s": round(rps, 4),
        "output_tokens_per_s": round(tps, 3),
        "output_tokens_per_s_per_gpu": round(tps / gpus, 3) if gpus else None,
        "requests_per_s_per_gpu": round(rps / gpus, 4) if gpus else None,
    }


def point_record(
    target: Target,
    plan: BenchPlan,
    c: int,
    m: ap.Measured | None,
    run: ap.Run,
    server: float | None,
    failure: str | None,
) -> tuple[dict, PointFigures]:
    m = m or ap.Measured()
    figures = PointFigures(
        c,
        m.requests_ok,
        m.requests_failed,
        m.output_tokens,
        m.output_tokens_mean,
        server,
        tuple(m.errors),
        run.timed_out,
        failure,
    )
    requests = m.requests_ok + m.requests_failed
    per_gpu = m.output_tokens_per_s / target.gpus if target.gpus else None
    rec = {
        "concurrency": c,
        "simulated": target.simulated,
        "valid": not judge_point(figures, plan.osl),
        "reasons": judge_point(figures, plan.osl),
        "requests_ok": m.requests_ok,
        "requests_failed": m.requests_failed,
        "ttft_ms": m.ttft_ms,
        "itl_ms": m.itl_ms,
        "e2e_ms": m.e2e_ms,
        "requests_per_s": round(m.requests_per_s, 4),
        "output_tokens_per_s": round(m.output_tokens_per_s, 3),
        "output_tokens_per_s_per_gpu": round(per_gpu, 3) if per_gpu is not None else None,
        "output_tokens_per_s_per_user": round(m.output_tokens_per_s_per_user, 3),
        "output_tokens_mean": round(m.output_tokens_mean, 2),
        "input_tokens_mean": round(m.input_tokens_mean, 2),
        "client_output_tokens": m.output_tokens,
        "server_output_tokens": server,
        "duration_s": round(m.duration_s, 3),
        "errors": m.errors[:10],
        "client": {
            "wall_s": round(run.wall_s, 3),
            "cpu_s": round(run.cpu_s, 3),
            "cpu_ms_per_request": round(1000 * run.cpu_s / requests, 2) if requests else None,
            "host_cpu_busy_pct": run.host_busy_pct,
            "cores": os.cpu_count(),
        },
        "requests_planned": plan.requests_at(c),
        "duration_bound_s": plan.duration,
    }
    return rec, figures


def measure_point(
    target: Target, plan: BenchPlan, c: int, out: Path, aiperf: str, echo: Callable[[str], None]
) -> tuple[dict, PointFigures]:
    point = ap.PointPlan(c, plan.isl, plan.osl, plan.requests_at(c), plan.duration, plan.seed)
    argv = ap.point_argv(aiperf, target.url, target.model, target.tokenizer, point, out)
    live = sys.stdout.isatty()

    def tick(elapsed: float) -> None:
        if live:
            print(
                f"\r  concurrency {c:>4}: running {elapsed:5.0f} s (at most {point.requests} requests, "
                f"{plan.duration:g} s)",
                end="",
                flush=True,
            )

    if not live:
        echo(f"  concurrency {c:>4}: running (at most {point.requests} requests, {plan.duration:g} s)")
    with bounded_client(5.0, timeout=5.0) as client:
        before = generated_tokens(client, target.metrics_urls)
        run = ap.run_point(argv, out, plan.duration + ap.GRACE_S + 30.0, tick)
        after = generated_tokens(client, target.metrics_urls)
    if live:
        print("\r" + " " * 90 + "\r", end="", flush=True)
    server = after - before if before is not None and after is not None else None
    failure, measured = None, None
    try:
        measured = ap.read_point(out)
    except ValueError as exc:
        tail = (
            (out / "aiperf.log").read_text(errors="replace").strip().splitlines()[-3:]
            if (out / "aiperf.log").exists()
            else []
        )
        failure = f"exit {run.returncode}: {exc}" + (f"; its log ends: {' | '.join(tail)}" if tail else "")
    all_failed = measured is not None and measured.requests_failed and not measured.requests_ok
    if failure is None and run.returncode not in (0, None) and not run.timed_out and not all_failed:
        failure = f"aiperf exited {run.returncode} (its log: {out / 'aiperf.log'})"
    rec, figures = point_record(target, plan, c, measured, run, server, failure)
    if plan.slo is not None:
        rec["goodput"] = goodput(
            plan.slo, ap.request_figures(out), rec["requests_per_s"], rec["output_tokens_per_s"], target.gpus
        )
    echo(progress_line(rec))
    return rec, figures


def progress_line(rec: dict) -> str:
    sim = " (simulated)" if rec["simulated"] else ""
    mark = "ok  " if rec["valid"] else "FAIL"
    t, i = rec["ttft_ms"], rec["itl_ms"]
    good = rec.get("goodput")
    line = (
        f"  {mark} concurrency {rec['concurrency']:>4}: {rec['requests_ok']} ok, {rec['requests_failed']} "
        "failed, "
        f"TTFT p50/p99 {_ms(t.get('p50'))}/{_ms(t.get('p99'))} ms, ITL p50/p99 {_ms(i.get('p50'), 2)}/"
        f"{_ms(i.get('p99'), 2)} ms, {rec['output_tokens_per_s']:.1f} tok/s"
        + (f", {good['attained_pct']:.0f}% inside the SLO" if good else "")
        + sim
    )
    return line + "".join(f"\n        {r}" for r in rec["reasons"])


def _ms(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def saturation_warning(points: list[dict]) -> str | None:
    busy = [p["client"]["host_cpu_busy_pct"] for p in points if p["client"]["host_cpu_busy_pct"] is not None]
    if busy and max(busy) >= SATURATED_PCT:
        return (
            f"warning: the client machine's CPUs were {max(busy):.0f}% busy during a point: the figures may "
            "be "
            f"the load generator's limit, not the deployment's (run bench from another machine, or lower "
            f"--concurrency)"
        )
    return None


def run_bench(target: Target, plan: BenchPlan, out: Path, echo: Callable[[str], None]) -> dict:
    """Every point, then the summary written with the record (record.py); the summary."""
    from .run_record import refuse_existing, write_run

    refuse_existing(out)
    aiperf = ap.find_aiperf()
    started = time.time()
    label = " (simulated: a rehearsal, no GPU)" if target.simulated else ""
    echo(
        f"{target.name}: bench through {target.url}, model {target.model}, ISL {plan.isl}, OSL {plan.osl}, "
        f"concurrency {','.join(map(str, plan.concurrencies))}{label}"
    )
    points, figures = [], []
    for c in plan.concurrencies:
        rec, fig = measure_point(target, plan, c, out / f"c{c}", aiperf, echo)
        points.append(rec)
        figures.append(fig)
    return write_run(target, plan, points, out, started, echo)
