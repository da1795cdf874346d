"""`sweep --vary split=P:D`: a P:D split of one host as the two roles' replicas and GPUs."""

from pathlib import Path

import pytest

from muse_launch.bench.measure import BenchPlan
from muse_launch.bench.split import Split, describe, parse_split, split_sets
from muse_launch.bench.sweep import SweepOptions, combo_sets, variant_text
from muse_launch.core import load_plan
from muse_launch.errors import UsageError
from muse_launch.topology.load import load_topology

EXAMPLE = Path(__file__).parents[2] / "examples" / "pd-split-rehearse.yaml"
PD_B300 = Path(__file__).parents[2] / "topologies" / "pd-b300-low-latency.yaml"


def opts_for(file: Path, *vary: str, sets: tuple[str, ...] = ()) -> SweepOptions:
    return SweepOptions(file, vary, sets, True, True, BenchPlan((2,), 64, 16, 8, 5.0), Path("/nonexistent"))


@pytest.mark.parametrize(
    "text, split", [("1:3", Split(1, 3)), (" 2P:2D ", Split(2, 2)), ("3:1", Split(3, 1))]
)
def test_a_split_reads_as_prefill_and_decode_replicas(text, split):
    assert parse_split(text) == split


@pytest.mark.parametrize("text", ["2", "0:4", "a:b", "2:-1", "1:2:3", "", "²:1", "1:٣", "99999:1"])
def test_a_split_that_is_not_one_says_what_to_write(text):
    with pytest.raises(UsageError) as err:
        parse_split(text)
    assert "PREFILL:DECODE" in str(err.value) and "split=1:3,2:2,3:1" in err.value.fix


def test_each_split_lays_both_roles_on_the_host_gpus_prefill_first():
    topology = load_topology(EXAMPLE).topology
    assert split_sets(topology, Split(1, 3)) == [
        "roles.prefill.replicas=1",
        "roles.prefill.gpus=[0, 1]",
        "roles.decode.replicas=3",
        "roles.decode.gpus=[2, 3, 4, 5, 6, 7]",
    ]
    for p, d in ((1, 3), (2, 2), (3, 1)):
        plan = load_plan(EXAMPLE, split_sets(topology, Split(p, d)), rehearse=True).plan
        held = {i.name: i.gpus for i in plan.specs if i.gpus}
        assert sorted(g for gpus in held.values() for g in gpus) == list(range(8))
        assert sum(1 for i in plan.specs if i.kind == "prefill") == p
        assert all(len(g) == 2 for g in held.values())  # each replica keeps the file's 2 GPUs


def test_a_split_that_does_not_fit_the_host_is_refused_with_the_splits_that_do():
    topology = load_topology(EXAMPLE).topology
    with pytest.raises(UsageError) as err:
        split_sets(topology, Split(3, 3))
    assert "3 prefill x 2 GPUs + 3 decode x 2 GPUs = 12 GPUs; the b300 host has 8" in str(err.value)
    assert err.value.fix == "--vary split=1:3,2:2,3:1"
    # the file's 4 GPUs per replica: only 1:1 fits
    with pytest.raises(UsageError) as err:
        split_sets(load_topology(PD_B300).topology, Split(1, 3))
    assert "= 16 GPUs" in str(err.value) and err.value.fix == "--vary split=1:1"


def test_a_split_whose_replica_ports_meet_is_refused_with_a_port_that_works():
    topology = load_topology(EXAMPLE, ["roles.decode.port=33002"]).topology
    with pytest.raises(UsageError) as err:
        split_sets(topology, Split(2, 2))
    assert "meet at 33002" in str(err.value) and err.value.fix == "--set roles.decode.port=33102"
    assert split_sets(load_topology(EXAMPLE, ["roles.decode.port=33102"]).topology, Split(2, 2))


def test_a_file_without_one_prefill_and_one_decode_cannot_be_split():
    agg = Path(__file__).parents[2] / "topologies" / "h200-nvfp4-marlin.yaml"
    with pytest.raises(UsageError) as err:
        split_sets(load_topology(agg).topology, Split(1, 1))
    assert "exactly one prefill and one decode role" in str(err.value)


def test_the_sweep_passes_a_split_as_its_sets_and_picks_the_file_with_it_written_in():
    opts = opts_for(EXAMPLE, "split=1:3,2:2", sets=("rehearse.ready_after=0.5",))
    sets = combo_sets(opts, ("split=2:2",))
    assert sets[0] == "rehearse.ready_after=0.5" and "roles.decode.gpus=[4, 5, 6, 7]" in sets
    text = variant_text(opts, ("split=2:2",))
    picked = EXAMPLE.with_name("picked.yaml")
    loaded = load_topology(EXAMPLE, sets).topology
    assert "replicas: 2" in text and loaded.roles["prefill"].replicas == 2
    assert not picked.exists()
    with pytest.raises(UsageError):
        combo_sets(opts, ("split=4:4",))


def test_a_split_reads_in_words_in_the_dry_run():
    sets = split_sets(load_topology(EXAMPLE).topology, Split(2, 2))
    assert describe(sets) == "prefill 2 x 2 GPUs (0-3), decode 2 x 2 GPUs (4-7)"
