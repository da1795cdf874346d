"""`plan --format mermaid|dot` read back by the real parsers: mermaid's own (under node) and graphviz's dot.
Every topology in topologies/ parses, and a hostile file's quotes, brackets, newlines and `;` stay text."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_run import REPO, muse
from graph_tools import HOSTILE, dot_svg, hostile_plan, mermaid_decoded, mermaid_parse

from muse_launch.plan.build import build_plan
from muse_launch.render_graph import build_graph, to_dot, to_mermaid
from muse_launch.topology.load import load_topology

pytestmark = [pytest.mark.integration, pytest.mark.graph]

TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))
SVG = "{http://www.w3.org/2000/svg}"


def _plan(path: Path):
    loaded = load_topology(path)
    return build_plan(loaded.topology), loaded.topology.start


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_mermaid_of_every_topology_parses_with_a_node_per_role_and_an_edge_per_wire(path: Path):
    ran = muse("plan", str(path), "--format", "mermaid")
    assert ran.returncode == 0, ran.stderr
    parsed = mermaid_parse(ran.stdout)
    assert parsed["ok"], parsed.get("error")
    plan, start = _plan(path)
    graph = build_graph(plan, start=start)
    assert len(parsed["vertices"]) == len(plan.specs)
    assert len(parsed["edges"]) == len(graph.edges)
    assert sorted(len(g["nodes"]) for g in parsed["subgraphs"]) == sorted(len(g.nodes) for g in graph.groups)
    labels = {mermaid_decoded(v["text"]).split("\n")[0] for v in parsed["vertices"]}
    assert labels == {s.name for s in plan.specs}


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_dot_of_every_topology_lays_out_with_graphviz(path: Path):
    ran = muse("plan", str(path), "--format", "dot")
    assert ran.returncode == 0, ran.stderr
    svg = dot_svg(ran.stdout)
    assert svg.returncode == 0, svg.stderr
    plan, start = _plan(path)
    root = ET.fromstring(svg.stdout)
    classes = [g.get("class") for g in root.iter(f"{SVG}g")]
    assert classes.count("node") == len(plan.specs)
    assert classes.count("edge") == len(build_graph(plan, start=start).edges)
    assert classes.count("cluster") == len(build_graph(plan, start=start).groups)


def test_epd_picture_shows_every_wire_of_the_cookbook_deployment():
    ran = muse("plan", str(REPO / "topologies/epd-b300.yaml"), "--format", "mermaid")
    parsed = mermaid_parse(ran.stdout)
    names = {v["id"]: mermaid_decoded(v["text"]).split("\n")[0] for v in parsed["vertices"]}
    edges = {(names[e["start"]], names[e["end"]]): mermaid_decoded(e["text"]) for e in parsed["edges"]}
    assert edges[("router", "prefill")] == "prefill, bootstrap 8998"
    assert edges[("router", "decode")] == "decode"
    assert edges[("prefill", "decode")] == "KV mooncake"
    assert edges[("encoder", "prefill")].startswith("encoder features, zmq_to_tokenizer, to bootstrap 8997")
    assert edges[("encoder", "decode")].startswith("encoder features, zmq_to_tokenizer, to bootstrap 8999")
    assert [e["stroke"] for e in parsed["edges"] if names[e["start"]] == "prefill"] == ["dotted"]


def test_hostile_values_stay_text_in_mermaid():
    plan = hostile_plan()
    graph = build_graph(plan)
    parsed = mermaid_parse(to_mermaid(graph))
    assert parsed["ok"], parsed.get("error")
    assert len(parsed["vertices"]) == len(plan.specs)  # nothing injected
    assert len(parsed["edges"]) == len(graph.edges)
    drawn = {mermaid_decoded(v["text"]) for v in parsed["vertices"]}
    assert drawn == {"\n".join(n.lines) for n in graph.nodes.values()}  # every character as it was
    assert {mermaid_decoded(e["text"]) for e in parsed["edges"]} == {e.label for e in graph.edges}
    assert {mermaid_decoded(g["title"]) for g in parsed["subgraphs"]} == {g.title for g in graph.groups}
    assert any(HOSTILE in text for text in drawn)


def test_hostile_values_stay_text_in_dot():
    plan = hostile_plan()
    graph = build_graph(plan)
    svg = dot_svg(to_dot(graph))
    assert svg.returncode == 0, svg.stderr
    root = ET.fromstring(svg.stdout)
    nodes = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]
    assert len(nodes) == len(plan.specs)
    texts = ["\n".join(t.text or "" for t in g.iter(f"{SVG}text")) for g in nodes]
    # graphviz draws each label line as one <text>; a newline in a value became a space
    expected = {"\n".join(line.replace("\n", " ") for line in n.lines) for n in graph.nodes.values()}
    assert {t.replace("\xa0", " ") for t in texts} == expected


def test_docs_pictures_match_what_plan_prints_now():
    """docs/pictures.md's mermaid block and docs/epd-b300.svg are what `plan` makes of epd-b300.yaml."""
    page = (REPO / "docs/pictures.md").read_text()
    block = page.split("```mermaid\n", 1)[1].split("\n```", 1)[0]
    epd = str(REPO / "topologies/epd-b300.yaml")
    assert block == muse("plan", epd, "--format", "mermaid").stdout.rstrip("\n")
    fresh = dot_svg(muse("plan", epd, "--format", "dot").stdout).stdout
    kept = (REPO / "docs/epd-b300.svg").read_text()
    texts = lambda svg: [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]  # noqa: E731  (layout may vary)
    assert texts(kept) == texts(fresh), (
        "regenerate: muse-launch plan topologies/epd-b300.yaml --format dot | dot -Tsvg > docs/epd-b300.svg"
    )
