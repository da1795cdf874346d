import pytest

from muse_launch.plan.graph import Cycle, waves


def test_waves_group_roles_whose_dependencies_are_ready_together():
    deps = {"encoder": [], "prefill": ["encoder"], "decode": ["encoder"], "router": ["prefill", "decode"]}
    assert waves(deps) == (("encoder",), ("prefill", "decode"), ("router",))


def test_waves_keep_file_order_within_a_wave_and_place_each_node_at_its_longest_path():
    deps = {"b": [], "a": [], "c": ["a"], "d": ["c", "b"], "e": ["b"]}
    assert waves(deps) == (("b", "a"), ("c", "e"), ("d",))


def test_cycle_names_every_member_back_to_the_start():
    with pytest.raises(Cycle) as caught:
        waves({"a": ["b"], "b": ["c"], "c": ["a"]})
    path = caught.value.path
    assert path[0] == path[-1] and set(path) == {"a", "b", "c"}


def test_empty_graph_has_no_waves():
    assert waves({}) == ()
