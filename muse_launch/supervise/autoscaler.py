"""The autoscaler at run time: every interval it reads each scaled role's own metrics (as `top` does),
asks the pure planner (plan/autoscale.py) for the next change, records it in the run directory's
`decisions.jsonl`, and, in act mode, makes it as `scale` does: a request on the deployment's control socket,
so it is placed, ready, wired and registered before it counts, drained before it stops, and serialized with
every other change (a busy supervisor defers it to the next interval).

On this host and on a SLURM batch host the supervisor runs it in a thread of its own (`running`), from
ready until supervising ends; `muse-launch autoscale NAME --advise` runs the same loop in the foreground.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace

import httpx

from muse_launch.change import ScaleRole, to_wire
from muse_launch.plan.autoscale import Memory, Observation, Window, decide, gpus_per_instance
from muse_launch.rundir.decisions import DECISIONS, describe, record_decision
from muse_launch.rundir.state import DeploymentRecord, RoleRecord, RunDir
from muse_launch.top.collect import Reading, quantile, read_all
from muse_launch.topology.model import AutoscaleConfig, Topology

GONE = ("stopped", "stopping")  # a failed instance still counts (as `scale` counts it): no manual change


@dataclass(frozen=True)
class Setup:
    """What the autoscaler needs of the file: its block, each scaled role's kind and GPUs per instance."""

    config: AutoscaleConfig
    kinds: Mapping[str, str]
    gpus_each: Mapping[str, int]

    @classmethod
    def of(cls, topology: Topology) -> Setup | None:
        cfg = topology.autoscale
        if cfg is None:
            return None
        roles = [r for r in cfg.roles if r in topology.roles]
        return cls(
            cfg,
            {r: topology.roles[r].kind for r in roles},
            {r: gpus_per_instance(topology, r) for r in roles},
        )


def role_of(record: RoleRecord) -> str:
    if record.role:
        return record.role
    base, _, index = record.name.rpartition("-")
    return base if base and index.isdigit() else record.name


def _merged_delta(now: list[Reading], before: Mapping[str, Reading], names: list[str], key: str):
    total: dict[float, float] = {}
    for reading, name in zip(now, names, strict=True):
        prev = before.get(name)
        if prev is None or prev.error or reading.error:
            continue
        b, a = reading.histograms.get(key), prev.histograms.get(key) or {}
        if not b:
            continue
        for le, count in b.items():
            delta = count - a.get(le, 0.0)
            if delta < 0:  # a restart: its counts began again
                break
            total[le] = total.get(le, 0.0) + delta
    return total


def observe(
    setup: Setup,
    record: DeploymentRecord,
    now: Mapping[str, Reading],
    before: Mapping[str, Reading],
    at: float,
) -> Observation:
    """The planner's view of each scaled role: its instances' readings now against the last ones."""
    q = setup.config.targets.percentile / 100
    windows: dict[str, Window] = {}
    for role in setup.config.roles:
        records = [r for r in record.roles if role_of(r) == role and r.state.value not in GONE]
        names = [r.name for r in records if r.name in now]
        readings = [now[n] for n in names]
        good = [x for x in readings if not x.error]
        if not records or not good:
            why = next((x.error for x in readings if x.error), "no instance serves metrics")
            windows[role] = Window(len(records), setup.gpus_each.get(role, 0), error=why)
            continue
        values = [x.values for x in good]

        def total(key: str, values=values) -> float | None:
            got = [v.get(key) for v in values if v.get(key) is not None]
            return sum(got) if got else None

        kv = [v.get("kv_cache_usage") for v in values if v.get("kv_cache_usage") is not None]
        requests, dt = None, None
        for x, n in zip(readings, names, strict=True):
            prev = before.get(n)
            c1 = x.values.get("ttft_count") if not x.error else None
            c0 = prev.values.get("ttft_count") if prev and not prev.error else None
            if c1 is not None and c0 is not None and c1 >= c0:
                requests = (requests or 0.0) + (c1 - c0)
                dt = max(dt or 0.0, x.at - prev.at)
        ttft = _merged_delta(readings, before, names, "ttft")
        itl = _merged_delta(readings, before, names, "itl")
        windows[role] = Window(
            instances=len(records),
            gpus_each=setup.gpus_each.get(role, 0),
            running=total("running"),
            queued=total("queued"),
            kv=max(kv) if kv else None,
            ttft=quantile(q, ttft) if ttft else None,
            itl=quantile(q, itl) if itl else None,
            requests=requests,
            rate=requests / dt if requests is not None and dt else None,
        )
    return Observation(at, windows)


def _shown(w: Window) -> dict[str, float | int | None]:
    return {
        "ttft_s": w.ttft,
        "itl_s": w.itl,
        "running": w.running,
        "queued": w.queued,
        "kv": w.kv,
        "requests/s": w.rate,
    }


Act = Callable[[str, int, str], int]  # (role, replicas, why) -> the role's instances after it


class Autoscaler:
    """One loop's state: the planner's memory and the last readings. `step` is one interval."""

    def __init__(
        self,
        setup: Setup,
        run_dir: RunDir,
        act: Act | None,
        say: Callable[[str], None],
        verbose: bool = False,
    ):
        self.verbose = verbose  # also say each interval's figures of a role it leaves as it is
        self.setup = setup
        self.run_dir = run_dir
        self.act = act  # None: advise only
        self.say = say
        self.memory: dict[str, Memory] = {}
        self.before: Mapping[str, Reading] = {}

    @property
    def mode(self) -> str:
        return "act" if self.act is not None and self.setup.config.mode == "act" else "advise"

    def step(self, record: DeploymentRecord, readings: Mapping[str, Reading], at: float) -> list[dict]:
        obs = observe(self.setup, record, readings, self.before, time.monotonic())
        self.before = readings
        decisions, self.memory = decide(self.setup.config, self.setup.kinds, obs, self.memory)
        lines = []
        changed = {d.role for d in decisions}
        for role, w in obs.roles.items():
            if self.verbose and role not in changed:
                figures = w.error or ", ".join(
                    f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in _shown(w).items()
                    if v is not None
                )
                self.say(f"autoscale: {role} stays at {w.instances} ({figures})")
        for d in decisions:
            outcome = "recorded" if d.after == d.before else "advised"
            if d.after != d.before and self.mode == "act":
                why = f"autoscale {d.role} {d.before} -> {d.after}: {'; '.join(d.reasons)}"[:2000]
                try:
                    count = self.act(d.role, d.after, why)  # type: ignore[misc]
                    outcome = "done"
                except Exception as exc:  # noqa: BLE001  a refusal or a failed change: said, retried later
                    count = d.before
                    outcome = f"not made: {exc}"
                self.memory[d.role] = replace(
                    self.memory[d.role], expected=count, changed_at=time.monotonic()
                )
            elif d.after != d.before:
                self.memory[d.role] = replace(self.memory[d.role], expected=d.before)
            line = record_decision(self.run_dir, d.to_json(), self.mode, outcome, at)
            self.say(f"autoscale: {describe(line)}")
            lines.append(line)
        return lines


def scale_by_request(run_dir: RunDir) -> Act:
    """Act as `scale` does: a request on the deployment's control socket."""
    from muse_launch.supervise import control_socket as control

    def act(role: str, replicas: int, why: str) -> int:
        result = control.request(run_dir, *to_wire(ScaleRole(role, replicas, why)), lambda s: None)
        instances = result.get("instances")
        return len(instances) if isinstance(instances, list) else replicas

    return act


def loop(
    autoscaler: Autoscaler,
    read_record: Callable[[], DeploymentRecord | None],
    stop: threading.Event,
    client: httpx.Client,
    interval: float | None = None,
    steps: int | None = None,
) -> None:
    """Read, decide, record (and act) every interval until `stop` is set (or `steps` intervals)."""
    every = interval if interval is not None else autoscaler.setup.config.interval
    with ThreadPoolExecutor(max_workers=8) as pool:
        done = 0
        next_at = time.monotonic()
        while not stop.is_set() and (steps is None or done <= steps):
            record = read_record()
            if record is None:
                return
            readings = read_all(record, client, pool)
            if done:  # the first reading is the start of the first window
                autoscaler.step(record, readings, time.time())
            else:
                autoscaler.before = readings
            done += 1
            next_at += every
            stop.wait(max(0.0, next_at - time.monotonic()))


@contextmanager
def running(
    setup: Setup | None,
    run_dir: RunDir,
    read_record: Callable[[], DeploymentRecord],
    say: Callable[[str], None],
) -> Iterator[None]:
    """The supervisor's autoscaler thread, while the block runs (nothing without an `autoscale:` block)."""
    if setup is None:
        yield
        return
    from muse_launch.top.deadline import bounded_client

    stop = threading.Event()
    act = scale_by_request(run_dir) if setup.config.mode == "act" else None
    auto = Autoscaler(setup, run_dir, act, say)

    def main() -> None:
        with bounded_client(3.0) as client:
            try:
                loop(auto, read_record, stop, client)
            except Exception as exc:  # noqa: BLE001  the deployment goes on serving without it
                say(f"autoscale: stopped: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=main, name="autoscale", daemon=True)
    thread.start()
    say(
        f"autoscale: {setup.config.mode}, every {setup.config.interval:g}s, "
        + ", ".join(f"{r} {b.min}..{b.max}" for r, b in setup.config.roles.items())
        + f"; decisions in {run_dir.path / DECISIONS}"
    )
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5.0)
