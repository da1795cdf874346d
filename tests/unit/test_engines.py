"""Each engine's facts live in its module under muse_launch/engines/, written once; the planning core's
layers import downwards only (topology <- plan <- checks); a rehearsal is a re-checked transformation."""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from muse_launch.checks import recheck_placement
from muse_launch.core import load_plan
from muse_launch.engines import ENGINES, ROUTER_ENGINES, WORKER_ENGINES
from muse_launch.engines.base import Engine, WorkerEngine, missing_facts
from muse_launch.engines.router import RouterEngine
from muse_launch.plan.rehearse import loopback_addresses, rehearsal_plan, relocate
from muse_launch.topology import model
from muse_launch.topology.load import load_topology

REPO = Path(__file__).resolve().parents[2]


PACKAGE = REPO / "muse_launch"


FLAG = re.compile(r"""["'](--[a-z][a-z0-9-]{2,})["']""")


def test_registry_names_the_engines_the_schema_accepts():
    assert set(WORKER_ENGINES) == set(model.WORKER_ENGINES)
    assert set(ROUTER_ENGINES) == set(model.ROUTER_ENGINES)
    assert set(ENGINES) == {*WORKER_ENGINES, *ROUTER_ENGINES, "command"}
    for name, module in ENGINES.items():
        assert module.NAME == name and callable(module.render) and isinstance(module.DEFAULT_LAUNCHER, tuple)


def test_every_engine_gives_every_fact_its_kind_declares():
    """An engine is one object whose facts are declared once (engines/base.py, router.py) and given by each
    engine: every instance has them all, and a new engine lacking one cannot be made."""
    for name, engine in ENGINES.items():
        assert isinstance(engine, Engine) and missing_facts(type(engine)) == [], name
        declared = {n for c in type(engine).__mro__ for n in getattr(c, "__annotations__", {}) if n.isupper()}
        assert {"NAME", "DEFAULT_LAUNCHER", "KEY_FLAGS", "PORT_FLAGS", "RELEASE"} <= declared
        assert all(hasattr(engine, fact) for fact in declared), name
    for name in WORKER_ENGINES:
        assert isinstance(ENGINES[name], WorkerEngine) and ENGINES[name].FACTS.name == name
    for name in ROUTER_ENGINES:
        assert isinstance(ENGINES[name], RouterEngine) and ENGINES[name].FACTS.name == name


WORKER_FACTS = missing_facts(WorkerEngine)  # every fact a worker engine declares, none given by the base


@pytest.mark.parametrize("fact", WORKER_FACTS)
def test_a_worker_engine_missing_one_fact_cannot_be_made(fact: str):
    """SGLang's class written again without one fact: making it fails and names the fact."""
    sglang = type(ENGINES["sglang"])
    body = {k: v for k, v in vars(sglang).items() if k not in (fact, "__dict__", "__weakref__")}
    half = type("Half", (WorkerEngine,), body)
    assert missing_facts(half) == [fact]
    with pytest.raises(TypeError, match=fact):
        half()
    assert type("Whole", (WorkerEngine,), {**body, fact: getattr(sglang, fact)})().NAME == "sglang"


def _literal_flags(path: Path) -> set[str]:
    return set(FLAG.findall(path.read_text())) - _cli_options(path)


def _cli_options(path: Path) -> set[str]:
    """The command line's own options a module declares (typer.Option("--model", ...)): not engine flags."""
    import ast

    return {
        arg.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option"
        for arg in node.args
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
    }


def test_engine_flags_are_written_in_their_engine_module_only():
    """A flag an engine module defines appears as a literal nowhere else in the planning core, checks,
    init and smoke: those import it (the CLI's own options and the simulated engine's parser aside)."""
    engine_flags = set().union(*(_literal_flags(p) for p in (PACKAGE / "engines").glob("*.py")))
    readers = [
        *(PACKAGE / "plan").glob("*.py"),
        *(PACKAGE / "checks").glob("*.py"),
        PACKAGE / "smoke.py",
        PACKAGE / "core.py",
        *(PACKAGE / "commands").glob("*.py"),
    ]
    repeated = {str(p.relative_to(REPO)): sorted(_literal_flags(p) & engine_flags) for p in readers}
    assert {p: f for p, f in repeated.items() if f} == {}


def test_relocate_moves_addresses_urls_and_host_ports_only():
    moves = {"10.0.0.1": "127.0.0.1", "10.0.0.2": "127.0.0.2"}
    assert relocate("10.0.0.2", moves) == "127.0.0.2"
    assert relocate("10.0.0.1:20000", moves) == "127.0.0.1:20000"
    assert relocate("http://10.0.0.2:30002", moves) == "http://127.0.0.2:30002"
    assert relocate("10.0.0.12", moves) == "10.0.0.12"
    assert relocate("meta/10.0.0.1-model", moves) == "meta/10.0.0.1-model"
    assert relocate('{"kv_connector":"NixlConnector"}', moves) == '{"kv_connector":"NixlConnector"}'


def test_rehearsal_gives_each_machine_its_own_loopback_address(tmp_path: Path):
    """Two roles on two hosts with one port: each host becomes its own loopback address, so they
    rehearse side by side, and the re-check of the moved plan finds nothing."""
    path = tmp_path / "two-hosts.yaml"
    path.write_text("""version: 1
name: two-hosts
hardware: cpu
model: m
host: 10.0.0.1
roles:
  a: {kind: command, host: 10.0.0.1, port: 9000, command: [serve, "{port}"]}
  b: {kind: command, host: 10.0.0.2, port: 9000, command: [serve, "{port}"]}
""")
    loaded = load_plan(path, rehearse=True)
    assert [(s.name, s.host, s.bind) for s in loaded.plan.specs] == [
        ("a", "127.0.0.1", "127.0.0.1"),
        ("b", "127.0.0.2", "127.0.0.2"),
    ]


def test_rehearsal_plan_is_checked_again(tmp_path: Path):
    """A transformation that lands two servers on one address and port is caught before anything starts."""
    topology = load_topology(REPO / "topologies" / "vllm-multinode-dep-b200.yaml").topology
    plan = load_plan(REPO / "topologies" / "vllm-multinode-dep-b200.yaml").plan
    collapsed = {a: "127.0.0.1" for a in loopback_addresses(plan, topology)}
    moved = replace(
        plan, specs=tuple(replace(s, host=collapsed[s.host], bind=collapsed[s.host]) for s in plan.specs)
    )
    assert recheck_placement(topology, rehearsal_plan(plan, topology, sys.executable)) == []
    findings = recheck_placement(topology, moved)
    assert [f.message for f in findings] == [
        "server@node1 binds HTTP port 8000, already the HTTP port of server@node0 on this host"
    ]


def test_a_connector_of_ones_own_passes_with_its_module_path(tmp_path: Path):
    """vLLM loads a connector it does not know from kv_connector_module_path; the checks let it through,
    and still refuse an unknown name given without one."""
    from muse_launch.checks import run_checks

    base = (REPO / "topologies" / "vllm-pd-b200.yaml").read_text()
    findings = {}
    for case, extra in (("module", '{"kv_connector_module_path": "my_pkg.kv"}'), ("bare", "{}")):
        path = tmp_path / f"{case}.yaml"
        path.write_text(base)
        loaded = load_topology(
            path,
            [
                f"roles.prefill.kv_transfer_config={extra}",
                f"roles.decode.kv_transfer_config={extra}",
                "roles.prefill.transfer_backend=MyConnector",
                "roles.decode.transfer_backend=MyConnector",
            ],
        )
        findings[case] = [f.message for f in run_checks(loaded)[0] if "KV connector" in f.message]
    assert findings["module"] == []
    assert findings["bare"] and all("vLLM has no KV connector MyConnector" in m for m in findings["bare"])
