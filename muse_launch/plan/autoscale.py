"""The autoscaler's planner, pure: what it observed of each scaled role over the last interval, and what it
remembers of the intervals before, -> the next change of each role, with the figures and reasons behind it.

Each role is scaled on its own bottleneck: prefill on its time to first token and its queued prompts;
decode on its inter-token latency, its queue (a full running batch) and its KV cache use; an aggregated
worker on all of them. The rules that keep it steady:

* up: a signal over its target two intervals running (at once when 1.5x over), by the share it is over
  (at most doubling), within max, the GPU budget and the room placement reports;
* down: one instance at a time, after DOWN_AFTER intervals in which even one instance fewer would stay
  well inside every target (the latency projected as if it grew with the square of the load per
  instance), and never while the load is above DOWN_LOAD_SHARE of the load that made it go up last;
* cool-down: after a change, no other change of that role for `cooldown` seconds (the new instances
  take their share first), but for a return to the minimum once the role is idle;
* idle (no request in the interval, nothing running or queued): back to the minimum at once;
* a count the planner did not make (a manual `scale`) is the floor (it went up) or the ceiling (it went
  down) for `manual_hold` seconds, and recorded as such, never undone silently.

Nothing here reads a clock, a file or the network: `decide` is replayed in unit tests on synthetic series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..topology.model import AutoscaleConfig, Topology

KV_HIGH = 0.85  # KV cache use above it: decode is about to evict or refuse
KV_LOW = 0.6  # one instance fewer must keep KV use under it
PREFILL_QUEUE_HIGH = 2.0  # queued prompts per prefill instance that count as over
DOWN_MARGIN = 0.7  # one instance fewer must keep every latency under this share of its target
DOWN_AFTER = 3  # intervals of slack before one instance goes
UP_AFTER = 2  # intervals over a target before it scales up (at once when URGENT times over)
URGENT = 1.5
MAX_STEP = 2.0  # an up at most doubles the role
DOWN_LOAD_SHARE = 0.8  # no down until the load is under this share of the load of the last up


def gpus_per_instance(topology: Topology, role: str) -> int:
    """The GPUs one instance of `role` holds: its share of the role's gpus (0 where it gives none)."""
    spec = topology.roles[role]
    return len(spec.gpus) // spec.replicas if spec.gpus else 0


@dataclass(frozen=True)
class Window:
    """One role's figures over the last interval (summed over its instances, KV use the highest)."""

    instances: int
    gpus_each: int = 0
    running: float | None = None
    queued: float | None = None
    kv: float | None = None
    ttft: float | None = None  # seconds, at the targets' percentile; None: no first token or no histogram
    itl: float | None = None
    requests: float | None = None  # first tokens given in the interval; None: unknown
    rate: float | None = None  # requests per second in the interval
    room: int | None = None  # more instances placement can find now; None: unknown (no limit known)
    error: str | None = None  # why the figures are missing: nothing is decided on them

    @property
    def load(self) -> float | None:
        if self.rate is not None:
            return self.rate
        if self.running is None and self.queued is None:
            return None
        return (self.running or 0.0) + (self.queued or 0.0)

    @property
    def idle(self) -> bool:
        return self.requests == 0 and not self.running and not self.queued


@dataclass(frozen=True)
class Observation:
    at: float  # seconds, any clock that moves forward
    roles: Mapping[str, Window]


@dataclass(frozen=True)
class Memory:
    """What the planner keeps of one role between intervals."""

    expected: int | None = None  # the count it last saw or made: another one is a manual change
    changed_at: float | None = None
    direction: int = 0  # of the last change: +1 up, -1 down
    load_at_up: float | None = None
    over: int = 0  # intervals over a target in a row
    slack: int = 0  # intervals with room to spare in a row
    floor: int | None = None  # a manual scale's, until manual_until
    ceiling: int | None = None
    manual_until: float | None = None
    held: str | None = None  # why it last could not go up (recorded once, until it changes)


@dataclass(frozen=True)
class Decision:
    role: str
    before: int
    after: int
    kind: str  # up | down | idle | manual | held
    reasons: tuple[str, ...]
    figures: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "from": self.before,
            "to": self.after,
            "kind": self.kind,
            "reasons": list(self.reasons),
            "figures": dict(self.figures),
        }


def _figures(w: Window) -> dict[str, Any]:
    out = {
        "instances": w.instances,
        "running": w.running,
        "queued": w.queued,
        "kv_cache_usage": w.kv,
        "ttft_s": w.ttft,
        "itl_s": w.itl,
        "requests": w.requests,
        "requests_per_s": w.rate,
    }
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


def _ratios(cfg: AutoscaleConfig, kind: str, w: Window) -> dict[str, float]:
    """Each signal of the role's bottleneck as a share of its limit: over 1 is over."""
    n = max(w.instances, 1)
    out: dict[str, float] = {}
    pct = f"p{cfg.targets.percentile:g}"
    if kind in ("prefill", "worker"):
        if cfg.targets.ttft and w.ttft is not None:
            out[f"ttft {pct} {w.ttft:.3f}s of target {cfg.targets.ttft:g}s"] = w.ttft / cfg.targets.ttft
        if w.queued is not None and kind == "prefill":
            out[f"{w.queued:g} queued prompts on {n}"] = w.queued / n / PREFILL_QUEUE_HIGH
    if kind in ("decode", "worker"):
        if cfg.targets.itl and w.itl is not None:
            out[f"itl {pct} {w.itl * 1000:.1f}ms of target {cfg.targets.itl * 1000:g}ms"] = (
                w.itl / cfg.targets.itl
            )
        if w.kv is not None:
            out[f"KV cache {w.kv:.0%} in use"] = w.kv / KV_HIGH
        if w.queued:
            running = max(w.running or 0.0, 1.0)
            out[f"{w.queued:g} requests queued behind a full batch of {running:g}"] = (
                running + w.queued
            ) / running
    return out


def _spare(ratios: Mapping[str, float], kind: str, w: Window) -> str | None:
    """Why one instance fewer would stay inside the targets, or None if it might not."""
    n = w.instances
    if n <= 1 or w.queued or not w.requests:
        return None
    grow = (n / (n - 1)) ** 2  # the latency, as if it grew with the square of the load per instance
    for name, r in ratios.items():
        limit = KV_LOW / KV_HIGH if name.startswith("KV") else DOWN_MARGIN
        if r * (n / (n - 1) if name.startswith("KV") else grow) >= limit:
            return None
    if not any(not name.startswith("KV") for name in ratios):
        return None  # no latency figure: no evidence it would hold
    return f"{n - 1} instances would stay under {DOWN_MARGIN:.0%} of the targets"


def decide(
    cfg: AutoscaleConfig,
    kinds: Mapping[str, str],
    obs: Observation,
    memory: Mapping[str, Memory],
) -> tuple[list[Decision], dict[str, Memory]]:
    """The next change of each role in `cfg.roles` (kinds: role -> prefill | decode | worker), and the
    memory to pass next time. A decision's `after` equal to `before` changes nothing (held, manual)."""
    interval_cd = cfg.cooldown if cfg.cooldown is not None else 2 * cfg.interval
    mem = {r: memory.get(r, Memory()) for r in cfg.roles}
    decisions: list[Decision] = []
    windows = {r: obs.roles[r] for r in cfg.roles if r in obs.roles and obs.roles[r].error is None}
    used = sum(w.instances * w.gpus_each for w in windows.values())
    order = sorted(
        windows, key=lambda r: -max(_ratios(cfg, kinds.get(r, "worker"), windows[r]).values(), default=0)
    )
    for role in order:
        w, m, bounds = windows[role], mem[role], cfg.roles[role]
        kind = kinds.get(role, "worker")
        figures = _figures(w)
        n = w.instances
        if m.manual_until is not None and obs.at >= m.manual_until:
            m = replace(m, floor=None, ceiling=None, manual_until=None)
        if m.expected is not None and n != m.expected:
            up = n > m.expected
            until = obs.at + cfg.manual_hold
            m = replace(
                m,
                floor=n if up else None,
                ceiling=None if up else n,
                manual_until=until,
                changed_at=obs.at,
                direction=0,
                over=0,
                slack=0,
                held=None,
            )
            decisions.append(
                Decision(
                    role,
                    m.expected or 0,
                    n,
                    "manual",
                    (
                        f"scaled by hand from {m.expected} to {n}: taken as the "
                        f"{'floor' if up else 'ceiling'} for {cfg.manual_hold:g}s",
                    ),
                    figures,
                )
            )
        lo = max(bounds.min, m.floor or 0)
        hi = min(bounds.max, m.ceiling if m.ceiling is not None else bounds.max)
        lo = min(lo, hi)
        ratios = _ratios(cfg, kind, w)
        worst = max(ratios.values(), default=0.0)
        over = worst > 1.0
        spare = None if over else _spare(ratios, kind, w)
        m = replace(m, over=m.over + 1 if over else 0, slack=m.slack + 1 if spare else 0, expected=n)
        cooling = m.changed_at is not None and obs.at - m.changed_at < interval_cd
        after, what, reasons = n, "", ()
        if w.idle and n > lo:
            after, what, reasons = lo, "idle", ("no request in the interval, nothing running or queued",)
        elif n < lo:
            after, what, reasons = lo, "up", (f"below its floor {lo}",)
        elif n > hi:
            after, what, reasons = hi, "down", (f"above its ceiling {hi}",)
        elif over and not cooling and (m.over >= UP_AFTER or worst >= URGENT):
            want = max(n + 1, math.ceil(n * min(worst, MAX_STEP)))
            after, what = want, "up"
            reasons = tuple(f"{name} ({r:.2f}x)" for name, r in ratios.items() if r > 1.0)
        elif spare and not cooling and m.slack >= DOWN_AFTER and n > lo:
            load = w.load
            if m.load_at_up is None or (load is not None and load < DOWN_LOAD_SHARE * m.load_at_up):
                after, what, reasons = n - 1, "down", (spare,)
        if what == "up" and after > n:
            after, limits = _room_for(after, n, hi, w, cfg.gpus, used)
            if after <= n:
                note = "; ".join(limits)
                if note != m.held:
                    decisions.append(
                        Decision(role, n, n, "held", (*reasons, f"cannot grow: {note}"), figures)
                    )
                m = replace(m, held=note)
                mem[role] = m
                continue
            reasons = (*reasons, *(f"limited: {x}" for x in limits))
        if after == n or not what:
            mem[role] = m if over else replace(m, held=None)
            continue
        used += (after - n) * w.gpus_each
        direction = 1 if after > n else -1
        mem[role] = replace(
            m,
            expected=after,
            changed_at=obs.at,
            direction=direction,
            load_at_up=w.load if direction > 0 else (None if what == "idle" else m.load_at_up),
            over=0,
            slack=0,
            held=None,
        )
        decisions.append(Decision(role, n, after, what, reasons, figures))
    return decisions, mem


def _room_for(want: int, n: int, hi: int, w: Window, budget: int | None, used: int) -> tuple[int, list[str]]:
    """`want` cut to max, the GPU budget and placement's room; and what cut it."""
    limits: list[str] = []
    after = want
    if after > hi:
        after = hi
        limits.append(f"at most {hi} instances")
    if budget is not None and w.gpus_each:
        fits = n + max((budget - used) // w.gpus_each, 0)
        if after > fits:
            after = fits
            limits.append(f"GPU budget {budget} ({used} in use, {w.gpus_each} per instance)")
    if w.room is not None and after > n + w.room:
        after = n + max(w.room, 0)
        limits.append(f"placement finds room for {w.room} more")
    return max(after, n), limits
