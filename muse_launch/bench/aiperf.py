"""One point of a benchmark: aiperf at one concurrency, bounded in requests and in time, and what it measured.

aiperf 0.13.0 writes `profile_export_aiperf.json` (schema 1.4: each metric with avg and p1..p99) and, with
`--export-level raw`, every request's response packets (`profile_export_raw.jsonl`). aiperf counts an HTTP
error and a stream without content as failed, not an SSE `error` event followed by `[DONE]`: the raw packets
are read here for those. The child gets the tokenizer as a local directory and no HF_HUB_OFFLINE (aiperf
refuses a local path with it set); nothing is fetched since the path is local.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from muse_launch.errors import MissingDependency

PIN = "aiperf==0.13.0"
# As README.md and docs/bench.md write it (tests/unit/test_bench.py holds them to the same line).
INSTALL = "pip install -e '.[bench]'   # in the muse-launch checkout; or: pip install " + PIN + " matplotlib"
EXPORT = "profile_export_aiperf.json"
RAW = "profile_export_raw.jsonl"
RECORDS = "profile_export.jsonl"  # one line per request; the only export when every request failed
SCHEMA = "1.4"
GRACE_S = 30.0  # past --duration, aiperf's own start-up and the last requests' end


def find_aiperf() -> str:
    """The aiperf program beside this Python (the bench extra), else on PATH; MissingDependency when
    absent."""
    here = Path(sys.executable).parent / "aiperf"
    found = str(here) if here.is_file() and os.access(here, os.X_OK) else shutil.which("aiperf")
    if not found:
        raise MissingDependency("bench drives aiperf, which is not installed", fix=INSTALL)
    return found


@dataclass(frozen=True)
class PointPlan:
    concurrency: int
    isl: int
    osl: int
    requests: int
    duration: float  # seconds: aiperf stops sending after it
    seed: int = 0


def point_argv(aiperf: str, url: str, model: str, tokenizer: str, p: PointPlan, out: Path) -> list[str]:
    return [
        aiperf,
        "profile",
        "--url",
        url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--use-server-token-count",
        "--no-gpu-telemetry",
        "--ui-type",
        "none",
        "--concurrency",
        str(p.concurrency),
        "--request-count",
        str(p.requests),
        "--benchmark-duration",
        f"{p.duration:g}",
        "--benchmark-grace-period",
        f"{GRACE_S:g}",
        "--isl",
        str(p.isl),
        "--osl",
        str(p.osl),
        "--extra-inputs",
        "ignore_eos:true",
        "--random-seed",
        str(p.seed),
        "--export-level",
        "raw",
        "--artifact-dir",
        str(out),
    ]


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    env.pop("HF_HUB_OFFLINE", None)  # aiperf refuses a local tokenizer path with it set
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


@dataclass
class Run:
    returncode: int
    wall_s: float
    cpu_s: float  # the load generator's own CPU (all its processes)
    host_busy_pct: float | None  # the client machine's CPU busy share over the point
    timed_out: bool = False


def run_point(argv: list[str], out: Path, limit_s: float, tick: Callable[[float], None]) -> Run:
    """Run aiperf to its end or `limit_s`; its output goes to out/aiperf.log."""
    import psutil

    out.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    psutil.cpu_percent(None)
    start = time.monotonic()
    timed_out = False
    with open(out / "aiperf.log", "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            start_new_session=True,
        )
        while proc.poll() is None:
            elapsed = time.monotonic() - start
            if elapsed > limit_s:
                timed_out = True
                _stop(proc)
                break
            tick(elapsed)
            time.sleep(0.5)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = psutil.cpu_percent(None)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(proc.returncode, time.monotonic() - start, cpu, busy, timed_out)


def _stop(proc: subprocess.Popen) -> None:
    import signal

    for sig, wait in ((signal.SIGINT, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Measured:
    """What aiperf measured at one point, and the failures it or the raw packets show."""

    requests_ok: int = 0
    requests_failed: int = 0
    ttft_ms: dict = field(default_factory=dict)  # p50, p90, p99, max, avg (None: aiperf gave none)
    itl_ms: dict = field(default_factory=dict)
    e2e_ms: dict = field(default_factory=dict)  # a request's whole latency, aiperf's request_latency
    requests_per_s: float = 0.0
    output_tokens_per_s: float = 0.0
    output_tokens_per_s_per_user: float = 0.0
    output_tokens: float = 0.0  # the client's total (the server's usage, counted per request)
    output_tokens_mean: float = 0.0
    input_tokens_mean: float = 0.0
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)


def _stat(d: dict, key: str, stat: str = "avg") -> float:
    value = (d.get(key) or {}).get(stat)
    return float(value) if isinstance(value, (int, float)) else 0.0


PERCENTILES = ("p50", "p90", "p99", "max")


def _pcts(d: dict, key: str) -> dict:
    figures = d.get(key) if isinstance(d.get(key), dict) else {}
    out = {}
    for stat in (*PERCENTILES, "avg"):
        v = figures.get(stat)
        out[stat] = round(float(v), 3) if isinstance(v, int | float) and not isinstance(v, bool) else None
    return out


_TO_MS = {"ms": 1.0, "us": 1e-3, "ns": 1e-6, "s": 1000.0, "sec": 1000.0}
LATENCIES = {"ttft": "time_to_first_token", "itl": "inter_token_latency", "e2e": "request_latency"}
MAX_RECORD_LINES = 1_000_000


def request_figures(out: Path) -> list[dict]:
    """Each successful request's TTFT, ITL and end-to-end latency in ms and its output tokens, from aiperf's
    per-request export (profile_export.jsonl); [] where there is none."""
    found: list[dict] = []
    try:
        f = open(out / RECORDS, errors="replace")  # noqa: SIM115
    except OSError:
        return found
    with f:
        for n, line in enumerate(f):
            if n >= MAX_RECORD_LINES:
                break
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(rec, dict) or rec.get("error") or not isinstance(rec.get("metrics"), dict):
                continue
            metrics, one = rec["metrics"], {}
            for short, name in (*LATENCIES.items(), ("tokens", "output_sequence_length")):
                m = metrics.get(name)
                v = m.get("value") if isinstance(m, dict) else None
                if isinstance(v, int | float) and not isinstance(v, bool):
                    scale = 1.0 if short == "tokens" else _TO_MS.get(str(m.get("unit", "ms")), 1.0)
                    one[short] = float(v) * scale
            found.append(one)
    return found


def output_total(d: dict) -> float:
    """Every output token, reasoning included: aiperf's total_output_tokens leaves reasoning out (it is 0 for
    a
    reasoning model that spends the whole budget thinking); total_osl is output_sequence_length's sum."""
    if "total_osl" in d:
        return _stat(d, "total_osl")
    return _stat(d, "total_output_tokens") + _stat(d, "total_reasoning_tokens")


def read_point(out: Path) -> Measured:
    """The export of one point; ValueError when it is missing or not aiperf's schema."""
    path = out / EXPORT
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        if (out / RECORDS).is_file():
            return from_records(out / RECORDS)  # aiperf writes no aggregate when every request failed
        raise ValueError(f"{path}: no aiperf export ({exc})") from None
    if not isinstance(d, dict) or str(d.get("schema_version", "")).split(".")[0] != SCHEMA.split(".")[0]:
        raise ValueError(
            f"{path}: schema_version {d.get('schema_version') if isinstance(d, dict) else '?'}, "
            f"expected {SCHEMA} (aiperf {PIN})"
        )
    m = Measured(
        ttft_ms=_pcts(d, "time_to_first_token"),
        itl_ms=_pcts(d, "inter_token_latency"),
        e2e_ms=_pcts(d, "request_latency"),
        requests_per_s=_stat(d, "request_throughput"),
        output_tokens_per_s=_stat(d, "output_token_throughput"),
        output_tokens_per_s_per_user=_stat(d, "output_token_throughput_per_user", "p50"),
        output_tokens=output_total(d),
        output_tokens_mean=_stat(d, "output_sequence_length"),
        input_tokens_mean=_stat(d, "input_sequence_length"),
        duration_s=_stat(d, "benchmark_duration"),
    )
    completed = int(_stat(d, "completed_request_count"))
    ok = int(_stat(d, "request_count"))
    failed = max(completed - ok, 0)
    for e in d.get("error_summary") or []:
        detail = e.get("error_details") or {}
        m.errors.append(
            f"{e.get('count', 1)} x {detail.get('code') or detail.get('type')}: "
            f"{str(detail.get('message'))[:200]}"
        )
    stream_errors = _stream_errors(out / RAW)
    m.errors += [f"SSE error event after a 200 (then [DONE]): {s}" for s in stream_errors[:5]]
    m.requests_failed = failed + len(stream_errors)
    m.requests_ok = max(ok - len(stream_errors), 0)
    return m


def from_records(path: Path) -> Measured:
    """Only the per-request records (every request failed): how many, and their errors."""
    m = Measured()
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        error = rec.get("error") if isinstance(rec, dict) else None
        if error:
            m.requests_failed += 1
            key = (
                f"{error.get('code') or error.get('type')}: {str(error.get('message'))[:200]}"
                if isinstance(error, dict)
                else str(error)[:200]
            )
            counts[key] = counts.get(key, 0) + 1
        elif isinstance(rec, dict):
            m.requests_ok += 1
    m.errors = [f"{n} x {key}" for key, n in counts.items()]
    return m


def _stream_errors(raw: Path) -> list[str]:
    """Requests answered 200 whose stream carried an `error` event: aiperf counts them as ok."""
    found = []
    try:
        lines = raw.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("status") not in (200, None):
            continue  # aiperf counted it
        for resp in rec.get("responses") or []:
            hit = next((p for p in resp.get("packets") or [] if _is_error_packet(p)), None)
            if hit is not None:
                found.append(str(hit.get("value"))[:200])
                break
    return found


def _is_error_packet(packet: dict) -> bool:
    if packet.get("name") == "event" and str(packet.get("value")).strip() == "error":
        return True
    if packet.get("name") != "data":
        return False
    try:
        value = json.loads(packet.get("value") or "")
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value and not value.get("choices")
