"""The autoscaler's planner on synthetic series, without processes: each role on its own bottleneck, the
budget and placement's room never exceeded, no reversal at a steady load, back to the minimum when the
load goes, a manual scale kept."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from muse_launch.plan.autoscale import Memory, Observation, Window, decide
from muse_launch.topology.model import AutoscaleConfig

KINDS = {"prefill": "prefill", "decode": "decode"}


def config(**over) -> AutoscaleConfig:
    data = {
        "targets": {"ttft": 0.5, "itl": 0.05, "percentile": 90},
        "roles": {"prefill": {"min": 1, "max": 8}, "decode": {"min": 1, "max": 8}},
        "gpus": 16,
        "interval": 10,
    }
    data.update(over)
    return AutoscaleConfig.model_validate(data)


def model(role: str, n: int, load: float, gpus_each: int = 1, room: int | None = None) -> Window:
    """A role serving `load` requests/s on `n` instances: latency grows with the load per instance, its
    square past the knee (a queue forming), never below a base."""
    per = load / max(n, 1)
    if role == "prefill":
        ttft = 0.05 + 0.1 * per + 0.02 * per**2
        return Window(
            n,
            gpus_each,
            running=per * n * 0.1,
            queued=0.0,
            ttft=ttft,
            requests=load * 10,
            rate=load,
            room=room,
        )
    itl = 0.01 + 0.004 * per + 0.0005 * per**2
    return Window(
        n,
        gpus_each,
        running=per * n,
        queued=0.0,
        kv=min(per * 0.03, 1.0),
        itl=itl,
        requests=load * 10,
        rate=load,
        room=room,
    )


def run(cfg: AutoscaleConfig, loads: list[float], start: dict[str, int] | None = None, room=None):
    """Replays a load series: each decision applied at once. Returns the counts per step and decisions."""
    counts = dict(start or {r: b.min for r, b in cfg.roles.items()})
    memory: dict[str, Memory] = {}
    history, decisions = [], []
    for i, load in enumerate(loads):
        obs = Observation(i * cfg.interval, {r: model(r, counts[r], load, room=room) for r in counts})
        made, memory = decide(cfg, KINDS, obs, memory)
        for d in made:
            counts[d.role] = d.after
        decisions.extend(made)
        history.append(dict(counts))
    return history, decisions


def reversals(history: list[dict[str, int]], role: str) -> int:
    moves = [b[role] - a[role] for a, b in zip(history, history[1:], strict=False) if b[role] != a[role]]
    return sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))


def test_a_step_up_scales_both_roles_and_zero_traffic_returns_to_the_minimum() -> None:
    cfg = config()
    history, decisions = run(cfg, [5.0] * 6 + [15.0] * 12 + [0.0] * 3)
    assert history[17]["prefill"] > history[5]["prefill"]
    assert history[17]["decode"] > history[5]["decode"]
    assert history[-1] == {"prefill": 1, "decode": 1}
    assert history[-2] == {"prefill": 1, "decode": 1}  # within one interval of the load stopping
    idle = [d for d in decisions if d.kind == "idle"]
    assert idle and all("no request" in d.reasons[0] for d in idle)
    ups = [d for d in decisions if d.kind == "up"]
    assert any("ttft p90" in r for d in ups for r in d.reasons)
    assert any("itl p90" in r for d in ups for r in d.reasons)


def test_unknown_figures_decide_nothing() -> None:
    """A role whose metrics could not be read is held as it is, not taken for idle."""
    cfg = config()
    obs = Observation(
        0,
        {"prefill": Window(3, 1, error="metrics: connection refused"), "decode": Window(3, 1, requests=None)},
    )
    made, _ = decide(cfg, KINDS, obs, {})
    assert made == []


def test_the_budget_holds_and_is_said_once() -> None:
    cfg = config(gpus=5)
    history, decisions = run(cfg, [40.0] * 10)
    assert all(h["prefill"] + h["decode"] <= 5 for h in history)
    held = [d for d in decisions if d.kind == "held"]
    assert held and "GPU budget 5" in held[0].reasons[-1]
    assert len({d.reasons for d in held if d.role == held[0].role}) == len(
        [d for d in held if d.role == held[0].role]
    )


def test_placement_room_caps_an_up() -> None:
    cfg = config()
    history, decisions = run(cfg, [40.0] * 4, room=0)
    assert all(h == {"prefill": 1, "decode": 1} for h in history)
    assert any("placement finds room for 0 more" in d.reasons[-1] for d in decisions if d.kind == "held")


def test_a_manual_scale_is_the_floor_for_its_hold() -> None:
    cfg = config(manual_hold=100)
    memory: dict[str, Memory] = {}
    counts = {"prefill": 1, "decode": 1}
    kinds = KINDS
    made = []
    for i in range(30):
        if i == 3:
            counts["decode"] = 4  # `scale decode 4` by hand
        obs = Observation(i * 10, {r: model(r, counts[r], 1.0) for r in counts})
        step, memory = decide(cfg, kinds, obs, memory)
        for d in step:
            counts[d.role] = d.after
        made.append((i, dict(counts), step))
    manual = [d for _, _, step in made for d in step if d.kind == "manual"]
    assert len(manual) == 1 and "floor for 100s" in manual[0].reasons[0]
    assert all(c["decode"] == 4 for i, c, _ in made if 3 <= i < 13)  # kept while the hold lasts
    assert made[-1][1]["decode"] < 4  # then the light load takes it down


def test_down_one_at_a_time_after_the_load_falls() -> None:
    cfg = config()
    history, decisions = run(cfg, [30.0] * 15 + [3.0] * 30)
    downs = [d for d in decisions if d.kind == "down"]
    assert downs and all(d.before - d.after == 1 for d in downs)
    for role in ("prefill", "decode"):
        assert reversals(history[:15], role) == 0 and reversals(history[15:], role) == 0
        assert all(b[role] <= a[role] for a, b in zip(history[15:], history[16:], strict=False))


@settings(max_examples=60, deadline=None)
@given(
    load=st.floats(min_value=0.5, max_value=60.0),
    budget=st.integers(min_value=2, max_value=16),
    pmin=st.integers(min_value=1, max_value=3),
    steps=st.integers(min_value=10, max_value=40),
)
def test_steady_load_never_reverses_nor_exceeds_the_budget(load, budget, pmin, steps) -> None:
    cfg = config(
        gpus=max(budget, pmin + 1), roles={"prefill": {"min": pmin, "max": 8}, "decode": {"min": 1, "max": 8}}
    )
    history, _ = run(cfg, [load] * steps)
    assert all(h["prefill"] + h["decode"] <= cfg.gpus for h in history)
    assert reversals(history, "prefill") == 0
    assert reversals(history, "decode") == 0


@settings(max_examples=60, deadline=None)
@given(
    loads=st.lists(st.floats(min_value=0.0, max_value=80.0), min_size=2, max_size=40),
    budget=st.integers(min_value=2, max_value=12),
)
def test_any_series_stays_in_bounds_and_budget(loads, budget) -> None:
    cfg = config(gpus=budget)
    history, decisions = run(cfg, loads)
    for h in history:
        assert h["prefill"] + h["decode"] <= budget
        assert all(1 <= h[r] <= 8 for r in h)
    assert all(d.after == d.before for d in decisions if d.kind == "held")


def test_noise_does_not_flap() -> None:
    """A load that wobbles +-10% around a level makes no reversal."""
    cfg = config()
    loads = [20.0 * (1.1 if i % 2 else 0.9) for i in range(40)]
    history, _ = run(cfg, loads)
    assert reversals(history, "prefill") == 0 and reversals(history, "decode") == 0


def test_decisions_carry_the_figures() -> None:
    cfg = config()
    _, decisions = run(cfg, [30.0] * 4)
    d = decisions[0].to_json()
    assert d["from"] < d["to"] and d["figures"]["requests_per_s"] == 30.0 and d["reasons"]
    assert replace(decisions[0], after=decisions[0].before).after == decisions[0].before
