"""Whole rollouts replayed through the pure planner (plan/rollout.py), without processes: each step the
planner gives is taken as performed (or as failed, where the replay says so), until it says Complete or
Blocked. What the executor (supervise/change_executor.py) does is the steps in this order."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from muse_launch.plan.rollout import (
    Addition,
    Blocked,
    BringBack,
    BringIn,
    Complete,
    NoRoom,
    PlaceSurge,
    Progress,
    Removal,
    Replace,
    Restart,
    RestartRouters,
    ScaleDown,
    ScaleUp,
    Stop,
    TakeOut,
    Withdraw,
    next_step,
)


def replay(state, fail_at: int | None = None, placed=None, fail_undo_at: int | None = None):
    """The steps in order and how the rollout ended. `fail_at`: the forward step (0-based) that fails;
    `placed`: what looking for a surge instance finds; `fail_undo_at`: an undo step that fails too."""
    steps, forward, undoing = [], 0, 0
    for _ in range(1000):
        answer = next_step(state)
        if not isinstance(answer, Progress):
            return steps, answer
        step = answer.step
        steps.append(step)
        if state.failure is not None:
            if undoing == fail_undo_at:
                state = state.failing(step, "undo failed too")
            else:
                state = state.after(step)
            undoing += 1
            continue
        if forward == fail_at:
            state = state.failing(step, f"{step} failed", fix="look at its log")
        elif isinstance(step, PlaceSurge):
            state = replace(state, placed=placed).after(step)
        else:
            state = state.after(step)
        forward += 1
    raise AssertionError("the rollout never ended")


# ---- scale ------------------------------------------------------------------------------------------------


def test_scale_up_brings_each_placed_instance_in_in_order_then_restarts_static_routers():
    state = ScaleUp(role="decode", placed=("decode-1", "decode-2"), static_routers=True)
    steps, end = replay(state)
    assert steps == [BringIn("decode-1"), BringIn("decode-2"), RestartRouters("decode")]
    assert end == Complete()


def test_scale_up_with_routers_taking_workers_at_run_time_restarts_none():
    steps, end = replay(ScaleUp(role="decode", placed=("decode-1",)))
    assert steps == [BringIn("decode-1")] and end == Complete()


def test_scale_up_failing_mid_way_takes_out_what_it_brought_in_last_first():
    state = ScaleUp(role="decode", placed=("decode-1", "decode-2", "decode-3"))
    steps, end = replay(state, fail_at=2)
    assert steps == [
        BringIn("decode-1"),
        BringIn("decode-2"),
        BringIn("decode-3"),  # fails: it withdraws itself
        Withdraw("decode-2"),
        Withdraw("decode-1"),
    ]
    assert end == Blocked(f"{BringIn('decode-3')} failed", "look at its log", undone=True)


def test_scale_up_whose_router_restart_fails_takes_out_every_instance_it_added():
    state = ScaleUp(role="decode", placed=("decode-1", "decode-2"), static_routers=True)
    steps, end = replay(state, fail_at=2)
    assert steps[3:] == [Withdraw("decode-2"), Withdraw("decode-1")]
    assert isinstance(end, Blocked) and end.undone


def test_scale_down_takes_the_highest_replicas_out_first():
    state = ScaleDown(role="decode", current=("decode", "decode-1", "decode-2", "decode-3"), replicas=2)
    steps, end = replay(state)
    assert steps == [TakeOut("decode-3"), TakeOut("decode-2")] and end == Complete()


def test_scale_down_restarts_static_routers_without_each_instance_before_it_leaves():
    current = ("decode", "decode-1", "decode-2")
    state = ScaleDown(role="decode", current=current, replicas=1, static_routers=True)
    steps, _ = replay(state)
    assert steps == [
        RestartRouters("decode", -1),
        TakeOut("decode-2"),
        RestartRouters("decode", -1),
        TakeOut("decode-1"),
    ]


def test_scale_down_failing_mid_way_brings_back_what_it_took_out_and_goes_on_past_a_failed_undo():
    state = ScaleDown(role="decode", current=("decode", "decode-1", "decode-2", "decode-3"), replicas=1)
    steps, end = replay(state, fail_at=2, fail_undo_at=0)
    assert steps == [
        TakeOut("decode-3"),
        TakeOut("decode-2"),
        TakeOut("decode-1"),  # fails
        BringBack("decode-3", "decode"),  # fails too: said, and the undo goes on
        BringBack("decode-2", "decode"),
    ]
    assert isinstance(end, Blocked) and end.undone


@given(
    before=st.integers(min_value=1, max_value=8),
    after=st.integers(min_value=1, max_value=8),
    static=st.booleans(),
    fail_at=st.none() | st.integers(min_value=0, max_value=20),
)
def test_any_scale_either_reaches_its_replicas_or_is_undone_to_where_it_began(before, after, static, fail_at):
    """Counting what each step does to the role's instances: a completed scale leaves `after`, a failed one
    (each undo step succeeding) leaves `before`; no instance is taken out twice or brought in twice."""
    current = ("decode", *(f"decode-{i}" for i in range(1, before)))
    if after >= before:
        state = ScaleUp(
            role="decode", placed=tuple(f"decode-{i}" for i in range(before, after)), static_routers=static
        )
    else:
        state = ScaleDown(role="decode", current=current, replicas=after, static_routers=static)
    steps, end = replay(state, fail_at=fail_at)
    running = set(current)
    for index, step in enumerate(steps):
        if index == fail_at:
            continue  # a step that failed leaves the instances as they were (a new one withdraws itself)
        if isinstance(step, BringIn | BringBack):
            assert step.instance not in running
            running.add(step.instance)
        elif isinstance(step, TakeOut | Stop | Withdraw):
            assert step.instance in running
            running.discard(step.instance)
    if isinstance(end, Complete):
        assert len(running) == after
    else:
        assert isinstance(end, Blocked) and end.undone
        assert len(running) == before


# ---- add, remove ---------------------------------------------------------------------------------------


def test_an_addition_restarts_static_routers_after_the_instance_serves():
    steps, end = replay(Addition(role="decode", instance="decode-1", static_routers=True))
    assert steps == [BringIn("decode-1"), RestartRouters("decode")] and end == Complete()


def test_a_removal_drains_a_worker_and_stops_a_router_at_once():
    steps, _ = replay(Removal(role="decode", instance="decode-1"))
    assert steps == [TakeOut("decode-1")]
    steps, _ = replay(Removal(role="router", instance="router-1", scalable=False))
    assert steps == [Stop("router-1")]


def test_a_failed_addition_or_removal_has_nothing_to_undo():
    steps, end = replay(Removal(role="decode", instance="decode-1"), fail_at=0)
    assert steps == [TakeOut("decode-1")]
    assert end == Blocked(f"{TakeOut('decode-1')} failed", "look at its log", undone=True)


# ---- restart -------------------------------------------------------------------------------------------


def restart(**facts) -> Restart:
    return Restart(**{"role": "decode", "instance": "decode", "kind": "decode", **facts})


def test_a_restart_with_another_instance_serving_replaces_it_in_place():
    steps, end = replay(restart(serving_others=True))
    assert steps == [Replace("decode")] and end == Complete()


def test_a_restart_of_the_only_instance_with_room_surges_in_replaces_then_takes_the_surge_out():
    steps, end = replay(restart(), placed="decode-1")
    assert steps == [PlaceSurge("decode"), BringIn("decode-1"), Replace("decode"), TakeOut("decode-1")]
    assert end == Complete()


def test_a_restart_of_the_only_instance_without_room_is_refused_unless_downtime_is_allowed():
    no_room = NoRoom("one instance of decode needs 1 GPU; free: none", fix="`muse-launch down other`")
    steps, end = replay(restart(), placed=no_room)
    assert steps == [PlaceSurge("decode")]
    assert end == Blocked(f"no room for a surge instance: {no_room.why}", no_room.fix)
    steps, end = replay(restart(allow_downtime=True), placed=no_room)
    assert steps == [PlaceSurge("decode"), Replace("decode")] and end == Complete()


def test_the_only_router_is_restarted_in_place_only_with_downtime_allowed():
    end = next_step(restart(role="router", instance="router", kind="router", scalable=False))
    assert end == Blocked("router is the deployment's only router")
    router = restart(role="router", instance="router", kind="router", scalable=False)
    steps, _ = replay(replace(router, allow_downtime=True))
    assert steps == [Replace("router")]


def test_a_worker_behind_static_routers_is_replaced_then_its_routers_restarted():
    steps, _ = replay(restart(static_routers=True, allow_downtime=True))
    assert steps == [Replace("decode"), RestartRouters("decode")]


def test_a_restart_failing_after_its_surge_came_in_keeps_the_surge_serving():
    """The instance it replaces is out: the surge is what serves its role now, so it stays."""
    steps, end = replay(restart(), placed="decode-1", fail_at=2)
    assert steps == [PlaceSurge("decode"), BringIn("decode-1"), Replace("decode")]
    assert isinstance(end, Blocked) and end.undone and end.why == f"{Replace('decode')} failed"
