"""Where an added instance goes (muse_launch/plan/placement.py): exactly one instance's GPUs, from GPUs that
nobody holds; the file's own for that replica where they are free."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from muse_launch.core import load_plan
from muse_launch.plan.build import build_plan
from muse_launch.plan.placement import Room, choose_gpus, on_gpus, overlaps, with_replicas

REPO = Path(__file__).resolve().parents[2]


def test_a_new_decode_takes_the_free_gpus_not_a_share_of_the_running_ones():
    room = Room(
        tuple(range(8)), {0: "prefill", 1: "prefill", 2: "decode", 3: "decode", 4: "decode-1", 5: "decode-1"}
    )
    assert choose_gpus(2, room) == (6, 7)
    assert choose_gpus(4, room) is None  # no room: refused, never placed on a held GPU


def test_the_files_own_gpus_for_the_replica_come_first_where_they_are_free():
    room = Room(tuple(range(8)), {0: "prefill", 1: "decode"})
    assert choose_gpus(2, room, wanted=(4, 5)) == (4, 5)
    assert choose_gpus(2, room, wanted=(1, 5)) == (2, 5)  # 1 is held: the free one of them, then the lowest


def test_a_relaunch_in_place_may_keep_its_own_gpus():
    room = Room(tuple(range(4)), {0: "decode", 1: "decode", 2: "prefill", 3: "prefill"})
    assert choose_gpus(2, room, own=(0, 1)) == (0, 1)
    assert choose_gpus(2, room, wanted=(2, 3), own=(0, 1)) == (0, 1)  # the file's are another's now


@given(
    gpus=st.integers(min_value=0, max_value=16),
    held=st.sets(st.integers(min_value=0, max_value=15)),
    need=st.integers(min_value=1, max_value=8),
    wanted=st.lists(st.integers(min_value=0, max_value=15), max_size=8, unique=True),
)
def test_the_choice_is_exact_free_and_refused_only_when_too_few_are_free(gpus, held, need, wanted):
    room = Room(tuple(range(gpus)), {g: "someone" for g in held})
    chosen = choose_gpus(need, room, wanted)
    free = [g for g in range(gpus) if g not in held]
    if len(free) < need:
        assert chosen is None
    else:
        assert chosen is not None and len(chosen) == need == len(set(chosen))
        assert all(g in free for g in chosen)


def test_overlaps_names_every_gpu_two_instances_hold():
    assert overlaps({"decode": (4, 5, 6, 7), "decode-1": (6, 7), "prefill": (0, 1)}) == {
        6: ["decode", "decode-1"],
        7: ["decode", "decode-1"],
    }
    assert overlaps({"decode": (0,), "decode-1": (1,)}) == {}


def test_more_replicas_than_the_file_splits_keep_one_instances_gpu_count():
    """`scale decode 3` of a file whose decode has 4 GPUs for 2 replicas: planned (not a PlanError about an
    uneven split), each instance with 2 GPUs, the real ones given by choose_gpus."""
    topology = load_plan(REPO / "topologies" / "pd-b300-low-latency.yaml").loaded.topology
    roles = dict(topology.roles)
    roles["decode"] = roles["decode"].model_copy(update={"replicas": 2})
    topology = topology.model_copy(update={"roles": roles})
    plan = build_plan(with_replicas(topology, {"decode": 3}))
    decodes = [s for s in plan.specs if s.role == "decode"]
    assert [len(s.gpus) for s in decodes] == [2, 2, 2]
    moved = on_gpus(decodes[2], (6, 7), topology.hardware)
    assert moved.gpus == (6, 7) and moved.env["CUDA_VISIBLE_DEVICES"] == "6,7"


def test_a_new_instance_can_be_given_other_ports_than_its_stepped_ones():
    topology = load_plan(REPO / "topologies" / "pd-b300-low-latency.yaml").loaded.topology
    plan = build_plan(
        with_replicas(topology, {"prefill": 2}, {"prefill": {"http": 31000, "bootstrap": 9100}})
    )
    new = plan.spec("prefill-1")
    assert new.ports == {"http": 31000, "bootstrap": 9100}
    assert "31000" in new.args and "9100" in new.args
