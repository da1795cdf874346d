"""The plan as a picture: `plan FILE --format mermaid|dot`.

A pure function of the Plan: one graph (roles as nodes, grouped by machine; an edge for every wire),
written out as a mermaid flowchart or a graphviz digraph. Every name and value comes from the topology
file, so every label is escaped for its language and every identifier is generated here: a quote, a
bracket, a newline or a `;` in a role's args stays text in a label, never syntax.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .engines import WORKER, router, sglang
from .engines.argv import last_value
from .plan.spec import LaunchSpec, Plan

Redact = Callable[[str], str]
WIRE, KV, DIST, AFTER = "wire", "kv", "dist", "after"  # edge styles
MERMAID_ARROWS = {WIRE: "-->", KV: "-.->", DIST: "-.-", AFTER: "-.->"}
DOT_STYLES = {WIRE: "solid", KV: "dashed", DIST: "dotted", AFTER: "dotted"}
KIND_COLOURS = {
    "router": "#fde2c8",
    "prefill": "#d6e8fa",
    "decode": "#d9f2d9",
    "encoder": "#efe0f7",
    "worker": "#e8e8e8",
    "command": "#f5f5dc",
}
# Characters a mermaid label keeps as they are; every other one is written as an entity code (#NN;).
_MERMAID_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;/_-@=+*()")


@dataclass
class Node:
    id: str
    name: str
    kind: str
    lines: list[str]


@dataclass
class Cluster:
    id: str
    title: str
    nodes: list[str] = field(default_factory=list)


@dataclass
class Edge:
    src: str
    dst: str
    label: str
    style: str = WIRE


@dataclass
class Graph:
    title: str
    groups: list[Cluster]
    nodes: dict[str, Node]  # by spec name
    edges: list[Edge]


def build_graph(plan: Plan, redact: Redact = lambda s: s, start: str | None = None) -> Graph:
    """Nodes by machine, with each role's kind, engine, GPUs, ports and start wave; edges for the wiring.
    `start`: the file's `start:` (overlap, waves or None for the default), for the edges that may overlap."""
    wave = {name: i + 1 for i, names in enumerate(plan.waves) for name in names}
    overlapping = _overlapping(plan, start)
    nodes: dict[str, Node] = {}
    groups: dict[str, Cluster] = {}  # by the address the machine is reached at
    node_names: dict[str, list[str]] = {}
    for spec in plan.specs:
        if spec.node and spec.node not in node_names.setdefault(spec.host, []):
            node_names[spec.host].append(spec.node)
    for i, spec in enumerate(plan.specs):
        nodes[spec.name] = Node(
            f"n{i}", spec.name, spec.kind, [redact(line) for line in _node_lines(spec, wave[spec.name])]
        )
        if spec.host not in groups:
            names = node_names.get(spec.host)
            title = f"node {', '.join(names)} ({spec.host})" if names else f"host {spec.host}"
            groups[spec.host] = Cluster(f"g{len(groups)}", redact(title))
        groups[spec.host].nodes.append(spec.name)
    edges = _edges(plan, overlapping)
    for e in edges:
        e.label = redact(e.label)
    waves = f"{len(plan.waves)} start wave" + ("s" if len(plan.waves) != 1 else "")
    policy = (
        "; start: waves"
        if start == "waves"
        else f"; start: overlap ({sglang.NAME} >= {sglang.LATE_ENCODERS_SINCE})"
        if overlapping
        else ""
    )
    title = f"{plan.name}: {len(plan.specs)} processes in {waves}{policy}"
    return Graph(redact(title), list(groups.values()), nodes, edges)


def _node_lines(spec: LaunchSpec, wave: int) -> list[str]:
    ports = ", ".join(f"{k} {v}" for k, v in spec.ports.items()) or "no ports"
    gpus = f"GPUs {','.join(map(str, spec.gpus))}" if spec.gpus else "no GPUs"
    return [spec.name, f"{spec.kind}, {spec.engine}", f"{gpus}; wave {wave}", ports]


def _edges(plan: Plan, overlapping: set[tuple[str, str]]) -> list[Edge]:
    by_url = {s.url: s for s in plan.specs if s.url}
    edges: list[Edge] = []
    covered: set[tuple[str, str]] = set()  # (dependent, dependency) drawn by a wire

    def add(src: str, dst: str, label: str, style: str = WIRE) -> None:
        edges.append(Edge(src, dst, label, style))

    names = {s.name for s in plan.specs}
    for spec in plan.specs:
        if spec.kind == "router":
            prefills, decodes = _router_wires(spec, by_url, add, covered)
            for p in prefills:  # the router pairs them: each prefill hands its KV cache to each decode
                for d in decodes:
                    add(
                        p.name,
                        d.name,
                        f"KV {WORKER[p.engine].transfer_backend(p.args)}" + _side_channel(d),
                        KV,
                    )
        for dep in spec.depends_on:
            dep_spec = plan.spec(dep) if dep in names else None
            if dep_spec is not None and dep_spec.kind == "encoder" and spec.kind != "router":
                add(dep, spec.name, _encoder_label(spec, (spec.name, dep) in overlapping))
                covered.add((spec.name, dep))
    edges += _dist_init_edges(plan)
    for spec in plan.specs:
        for dep in spec.depends_on:
            if (spec.name, dep) not in covered:
                edges.append(Edge(dep, spec.name, "ready before", AFTER))
    return edges


def _router_wires(spec: LaunchSpec, by_url: dict[str, LaunchSpec], add, covered) -> tuple[list, list]:
    prefills, decodes = [], []
    for url, port in router.prefills(spec.args):
        if target := by_url.get(url.rstrip("/")):
            add(
                spec.name,
                target.name,
                f"prefill, bootstrap {port}" if port and port != "none" else "prefill, no bootstrap port",
            )
            prefills.append(target)
            covered.add((spec.name, target.name))
    for url in router.decodes(spec.args):
        if target := by_url.get(url.rstrip("/")):
            add(spec.name, target.name, "decode")
            decodes.append(target)
            covered.add((spec.name, target.name))
    for url in router.workers(spec.args):
        if target := by_url.get(url.rstrip("/")):
            add(spec.name, target.name, "worker")
            covered.add((spec.name, target.name))
    return prefills, decodes


def _side_channel(decode: LaunchSpec) -> str:
    port = decode.ports.get("side_channel")
    return f", side channel {port}" if port else ""


def _encoder_label(worker: LaunchSpec, overlaps: bool) -> str:
    backend = last_value(worker.args, sglang.KEY_FLAGS["encoder_transfer_backend"][0]) or "default backend"
    port = worker.ports.get("encoder_bootstrap")
    label = f"encoder features, {backend}" + (f", to bootstrap {port}" if port else "")
    return label + ("; starts alongside (overlap)" if overlaps else "")


def _dist_init_edges(plan: Plan) -> list[Edge]:
    """Each node rank of a multi-node role joins rank 0's rendezvous."""
    by_role: dict[str, list[LaunchSpec]] = {}
    for spec in plan.specs:
        if spec.node is not None:
            by_role.setdefault(spec.role, []).append(spec)
    out = []
    for ranks in by_role.values():
        if len(ranks) < 2:
            continue
        port = ranks[0].ports.get("dist_init")
        for other in ranks[1:]:
            out.append(
                Edge(other.name, ranks[0].name, f"joins dist-init {port}" if port else "joins rank 0", DIST)
            )
    return out


def _overlapping(plan: Plan, start: str | None) -> set[tuple[str, str]]:
    """(role, dependency) pairs that start together under `start: overlap` (engines allowing a late peer)."""
    if start == "waves":
        return set()
    from .plan.start_policy import OVERLAP, choose

    chosen = choose(plan, OVERLAP, {})
    return {
        (s.name, d) for s in plan.specs for d in s.depends_on if d not in chosen.start_after.get(s.name, ())
    }


# ---- mermaid --------------------------------------------------------------------------------------


def mermaid_text(text: str) -> str:
    """`text` for the inside of a quoted mermaid label: every character outside a plain set becomes its
    entity code (`#34;` for a quote), so nothing in it can end the string or start markup."""
    return "".join(c if c in _MERMAID_PLAIN else f"#{ord(c)};" for c in text)


def to_mermaid(graph: Graph) -> str:
    out = ["flowchart LR", f"  %% {mermaid_text(graph.title)}"]
    for group in graph.groups:
        out.append(f'  subgraph {group.id}["{mermaid_text(group.title)}"]')
        out.append("    direction TB")
        for name in group.nodes:
            node = graph.nodes[name]
            label = "<br>".join(mermaid_text(line) for line in node.lines)
            out.append(f'    {node.id}["{label}"]')
        out.append("  end")
    for e in graph.edges:
        src, dst = graph.nodes[e.src].id, graph.nodes[e.dst].id
        out.append(f'  {src} {MERMAID_ARROWS[e.style]}|"{mermaid_text(e.label)}"| {dst}')
    for kind, colour in KIND_COLOURS.items():
        members = [n.id for n in graph.nodes.values() if n.kind == kind]
        if members:
            out.append(f"  classDef {kind} fill:{colour},stroke:#555")
            out.append(f"  class {','.join(members)} {kind}")
    return "\n".join(out)


# ---- dot ------------------------------------------------------------------------------------------


def dot_text(text: str) -> str:
    """`text` for the inside of a double-quoted DOT string: backslash and quote escaped, control characters
    (a newline in an argument) as spaces, so nothing in it can end the string or become an escape."""
    cleaned = "".join(" " if ord(c) < 32 or ord(c) == 127 else c for c in text)
    return cleaned.replace("\\", "\\\\").replace('"', '\\"')


def to_dot(graph: Graph) -> str:
    out = [
        f'digraph "{dot_text(graph.title)}" {{',
        f'  graph [rankdir=LR, fontname="Helvetica", labelloc=t, label="{dot_text(graph.title)}"];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=10];',
    ]
    for i, group in enumerate(graph.groups):
        out.append(f"  subgraph cluster_{i} {{")
        out.append(f'    label="{dot_text(group.title)}"; style=rounded; color="#888888";')
        for name in group.nodes:
            node = graph.nodes[name]
            label = "\\n".join(dot_text(line) for line in node.lines)
            colour = KIND_COLOURS.get(node.kind, "#ffffff")
            out.append(f'    {node.id} [label="{label}", fillcolor="{colour}"];')
        out.append("  }")
    for e in graph.edges:
        src, dst = graph.nodes[e.src].id, graph.nodes[e.dst].id
        arrow = ", dir=none" if e.style == DIST else ""
        out.append(f'  {src} -> {dst} [label="{dot_text(e.label)}", style={DOT_STYLES[e.style]}{arrow}];')
    out.append("}")
    return "\n".join(out)


def plan_mermaid(plan: Plan, redact: Redact, start: str | None = None) -> str:
    return to_mermaid(build_graph(plan, redact, start))


def plan_dot(plan: Plan, redact: Redact, start: str | None = None) -> str:
    return to_dot(build_graph(plan, redact, start))
