"""render_graph: the plan as a graph (nodes by machine, an edge per wire) and its escaping."""

from __future__ import annotations

import re

from cli_run import REPO, muse
from graph_tools import HOSTILE, hostile_plan

from muse_launch.plan.build import build_plan
from muse_launch.render_graph import KV, build_graph, dot_text, mermaid_text, to_dot, to_mermaid
from muse_launch.topology.load import load_topology


def test_mermaid_text_leaves_nothing_that_ends_a_string_or_starts_markup():
    escaped = mermaid_text(HOSTILE)
    assert not set(escaped) & set('"\n[]{}|<>`%\\')
    assert re.sub(r"#(\d+);", lambda m: chr(int(m[1])), escaped) == HOSTILE  # and it decodes back


def test_dot_text_escapes_quote_and_backslash_and_flattens_control_characters():
    escaped = dot_text('a"b\\c\nd\x7f')
    assert escaped == 'a\\"b\\\\c d '
    assert not re.search(r'(?<!\\)"', escaped.replace("\\\\", ""))


def test_hostile_plan_renders_one_node_statement_per_spec():
    text = to_mermaid(build_graph(hostile_plan()))
    assert len(re.findall(r'^    n\d+\["', text, re.M)) == 4
    assert all(line.count('"') % 2 == 0 for line in text.splitlines())
    dot = to_dot(build_graph(hostile_plan()))
    assert len(re.findall(r"^    n\d+ \[label=", dot, re.M)) == 4


def test_epd_graph_has_the_wires_and_waves():
    loaded = load_topology(REPO / "topologies/epd-b300.yaml")
    graph = build_graph(build_plan(loaded.topology), start=loaded.topology.start)
    edges = {(e.src, e.dst): e for e in graph.edges}
    assert set(edges) == {
        ("router", "prefill"),
        ("router", "decode"),
        ("prefill", "decode"),
        ("encoder", "prefill"),
        ("encoder", "decode"),
    }
    assert edges[("prefill", "decode")].style == KV and edges[("prefill", "decode")].label == "KV mooncake"
    assert "starts alongside (overlap)" in edges[("encoder", "prefill")].label
    assert graph.nodes["router"].lines == [
        "router",
        "router, sglang-router",
        "no GPUs; wave 3",
        "http 8000, metrics 29000",
    ]
    assert [g.title for g in graph.groups] == ["host 127.0.0.1"]


def test_waves_file_draws_no_overlap_and_says_so(tmp_path):
    text = (REPO / "topologies/epd-b300.yaml").read_text().replace("roles:\n", "start: waves\nroles:\n", 1)
    path = tmp_path / "epd.yaml"
    path.write_text(text)
    loaded = load_topology(path)
    graph = build_graph(build_plan(loaded.topology), start=loaded.topology.start)
    assert not any("overlap" in e.label for e in graph.edges)
    assert graph.title.endswith("3 start waves; start: waves")


def test_machines_group_roles_by_address_and_multi_node_ranks_join_rank_zero():
    loaded = load_topology(REPO / "topologies/helion-gb300.yaml")
    graph = build_graph(build_plan(loaded.topology))
    assert [(g.title, g.nodes) for g in graph.groups] == [
        ("node tray0 (10.0.0.1)", ["prefill@tray0", "router"]),
        ("node tray1 (10.0.0.2)", ["decode@tray1"]),
    ]
    loaded = load_topology(REPO / "topologies/h200-bf16-2node.yaml")
    graph = build_graph(build_plan(loaded.topology))
    assert [(e.src, e.dst, e.label) for e in graph.edges] == [
        ("server@node1", "server@node0", "joins dist-init 20000")
    ]


def test_every_label_goes_through_redact():
    hide = lambda s: s.replace("pwn", "***")  # noqa: E731
    for text in (to_mermaid(build_graph(hostile_plan(), hide)), to_dot(build_graph(hostile_plan(), hide))):
        assert "pwn" not in text and "***" in text


def test_plan_command_prints_both_formats():
    for fmt, head in (("mermaid", "flowchart LR"), ("dot", "digraph ")):
        ran = muse("plan", str(REPO / "topologies/vllm-pd-b200.yaml"), "--format", fmt)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.startswith(head)
        assert "KV NixlConnector, side channel" in ran.stdout
