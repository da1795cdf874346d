"""Every topology in topologies/ renders the commands its document prints (or, where the document
only describes them, the commands derived in tests/data/golden/NAME.txt), order aside.

A golden file holds shell text as the document prints it: `export K=V` lines, `K=V` prefixes and
one command per `# role: NAME verbatim|derived` section (a `# setup` section is not compared).
Both sides become multisets of (flag, values) pairs; the program words must match exactly.
"""

from __future__ import annotations

import json
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_run import muse

from muse_launch.engines import ENGINES, ROUTER_ENGINES
from muse_launch.engines.router import RECOVERY_DEFAULTS
from muse_launch.plan.build import build_plan
from muse_launch.plan.spec import LaunchSpec
from muse_launch.topology.hardware import PROFILES
from muse_launch.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "data" / "golden"
# The documents the verbatim sections are copied from: the SGLang cookbook's and the vLLM recipe's pages, kept
# in the repository (a fresh clone has them); the team's copies beside a checkout, where they are, must agree.
REFERENCE = ROOT / "tests" / "data" / "reference"
DOCUMENTS = (
    "sglang-cookbook-muse-spark-open.txt",
    "vllm-recipe-muse-spark-open-guide.md",
    "vllm-recipe-muse-spark-open.json",
)
BESIDE = ROOT.parent / "shared" / "reference"

# A flag whose value is the engine's documented default may appear on one side only.
ALLOWED_DEFAULTS = {
    ("sglang-router", "--prometheus-port", ("29000",)),  # sglang-router 0.3.2 default
    ("vllm-router", "--prometheus-port", ("29000",)),  # vllm-router default
    ("vllm", "--host", ("0.0.0.0",)),  # vllm serve listens on every interface by default
    ("vllm", "--port", ("8000",)),  # vllm serve's default port
    ("vllm", "--master-port", ("29501",)),  # vLLM ParallelConfig.master_port
    ("vllm", "--data-parallel-rpc-port", ("13345",)),  # vLLM's default DP RPC port
}
# Flags muse-launch chooses for every router so that a restarted worker is taken back at once
# (muse_launch/engines/router.py RECOVERY_DEFAULTS, each router's startup_defaults): on the plan's side only.
ALLOWED_DEFAULTS |= {
    (engine, flag, (value,))
    for engine in ROUTER_ENGINES
    for flag, value in (*RECOVERY_DEFAULTS, *ENGINES[engine].FACTS.startup_defaults)
}
# ...and so may CUDA_/HIP_VISIBLE_DEVICES listing every GPU of the node (what a process sees anyway),
# and CUDA_DEVICE_ORDER=PCI_BUS_ID, which muse-launch gives every NVIDIA role (GPU N means one GPU to all).

Pairs = Counter


@dataclass
class Section:
    name: str
    provenance: str  # verbatim | derived
    text: str
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)


def parse_golden(path: Path) -> dict[str, Section]:
    sections: dict[str, Section] = {}
    current: Section | None = None
    lines: list[str] = []

    def close() -> None:
        if current is not None:
            current.text = "\n".join(lines).strip("\n")
            _parse_shell(current)
            sections[current.name] = current

    for line in path.read_text().splitlines():
        header = re.match(r"^# (role: (\S+) (verbatim|derived)|setup)\s*$", line)
        if header:
            close()
            current = Section(header.group(2), header.group(3), "") if header.group(2) else None
            lines = []
        elif current is not None and not line.startswith("#"):
            lines.append(line)
    close()
    return sections


def _parse_shell(section: Section) -> None:
    commands = [c for c in section.text.replace("\\\n", " ").splitlines() if c.strip()]
    for command in commands:
        words = shlex.split(command)
        if words[0] == "export":
            for word in words[1:]:
                key, _, value = word.partition("=")
                section.env[key] = value
            continue
        assert not section.argv, f"{section.name}: one command per section"
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            key, _, value = words.pop(0).partition("=")
            section.env[key] = value
        section.argv = words
    assert section.argv, f"{section.name}: no command"


def _canonical(value: str) -> str:
    """0.80 == 0.8, and JSON objects compare by content, not key order or spacing."""
    if value[:1] in "{[":
        try:
            return json.dumps(json.loads(value), sort_keys=True)
        except json.JSONDecodeError:
            return value
    try:
        return repr(float(value))
    except ValueError:
        return value


def flag_pairs(args: list[str] | tuple[str, ...]) -> Pairs:
    """(flag, values) pairs: a flag takes the words up to the next flag; leading words pair with None."""
    pairs: Pairs = Counter()
    flag, values = None, []
    for arg in args:
        if arg.startswith("-") and not re.match(r"^-\d", arg):
            if flag is not None or values:
                pairs[(flag, tuple(values))] += 1
            flag, values = arg, []
        else:
            values.append(_canonical(arg))
    if flag is not None or values:
        pairs[(flag, tuple(values))] += 1
    return pairs


def _allowed(engine: str, pairs: Pairs) -> Pairs:
    return Counter(
        {
            p: n
            for p, n in pairs.items()
            if (engine, p[0], tuple(_canonical(v) for v in p[1]))
            not in {(e, f, tuple(_canonical(v) for v in vs)) for e, f, vs in ALLOWED_DEFAULTS}
        }
    )


def _env_without_whole_node(env: dict[str, str], hardware: str) -> dict[str, str]:
    profile = PROFILES[hardware]
    whole = ",".join(str(g) for g in range(profile.gpus_per_node))
    return {
        k: v
        for k, v in env.items()
        if not (k == profile.visible_devices_var and v == whole) and profile.device_order_env.get(k) != v
    }


def _compare(spec: LaunchSpec, section: Section, hardware: str) -> list[str]:
    problems = []
    program = list(spec.launcher)
    if section.argv[: len(program)] != program:
        problems.append(f"program {section.argv[: len(program)]} != {program}")
    want = _allowed(spec.engine, flag_pairs(section.argv[len(program) :]))
    got = _allowed(spec.engine, flag_pairs(spec.args))
    for pair in sorted((want - got), key=str):
        problems.append(f"missing {pair}")
    for pair in sorted((got - want), key=str):
        problems.append(f"extra {pair}")
    want_env = _env_without_whole_node(section.env, hardware)
    got_env = _env_without_whole_node(dict(spec.env), hardware)
    if want_env != got_env:
        problems.append(f"env differs: document {want_env}, plan {got_env}")
    return problems


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_topology_renders_its_documents_commands(path: Path) -> None:
    golden = GOLDEN / f"{path.stem}.txt"
    assert golden.exists(), f"no reference commands for {path.name}: write {golden}"
    sections = parse_golden(golden)
    loaded = load_topology(path, environ={})
    plan = build_plan(loaded.topology)
    assert sorted(sections) == sorted(s.name for s in plan.specs), "one golden section per planned process"
    problems = {s.name: _compare(s, sections[s.name], loaded.topology.hardware) for s in plan.specs}
    assert not any(problems.values()), json.dumps({k: v for k, v in problems.items() if v}, indent=2)


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_topology_names_its_source(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# ") and re.search(r"cookbook|vLLM recipe", first, re.I), (
        f"{path.name} must start with a comment naming the document section it reproduces"
    )


@pytest.mark.parametrize("path", TOPOLOGIES, ids=lambda p: p.stem)
def test_topology_validates_strict(path: Path) -> None:
    run = muse("validate", path, "--strict", env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr


def _reference_text() -> str:
    missing = [name for name in DOCUMENTS if not (REFERENCE / name).is_file()]
    assert not missing, f"the documents the golden files quote are missing from {REFERENCE}: {missing}"
    for name in DOCUMENTS if BESIDE.is_dir() else ():
        assert (REFERENCE / name).read_bytes() == (BESIDE / name).read_bytes(), (
            f"{name} differs from {BESIDE}"
        )
    parts = [p.read_text() for p in sorted(REFERENCE.glob("*")) if p.suffix in (".txt", ".md")]

    def strings(node: object) -> None:
        if isinstance(node, str):
            parts.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                strings(value)
        elif isinstance(node, list):
            for value in node:
                strings(value)

    for path in REFERENCE.glob("*.json"):
        strings(json.loads(path.read_text()))
    return "\n".join(parts)


WITH_VERBATIM = [
    g
    for g in sorted(GOLDEN.glob("*.txt"))
    if any(s.provenance == "verbatim" for s in parse_golden(g).values())
]


@pytest.mark.parametrize("golden", WITH_VERBATIM, ids=lambda p: p.stem)
def test_verbatim_sections_are_copied_from_the_documents(golden: Path) -> None:
    verbatim = [s for s in parse_golden(golden).values() if s.provenance == "verbatim"]
    corpus = _reference_text()
    for section in verbatim:
        for line in section.text.splitlines():
            assert line.strip() in corpus, f"{golden.name} [{section.name}]: {line!r} is not in the documents"


def test_every_golden_file_has_a_topology() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == sorted(p.stem for p in TOPOLOGIES)


def test_comparison_sees_a_changed_value_and_a_missing_flag() -> None:
    """The comparison itself: order aside, but values, flags and repeats count."""
    base = ["--tp-size", "4", "--reasoning-parser", "muse", "--enable-x"]
    assert flag_pairs(base) == flag_pairs(["--enable-x", "--reasoning-parser", "muse", "--tp-size", "4"])
    assert flag_pairs(base) != flag_pairs(["--tp-size", "8", "--reasoning-parser", "muse", "--enable-x"])
    assert flag_pairs(base) != flag_pairs(["--tp-size", "4", "--reasoning-parser", "muse"])
    assert flag_pairs(["--mem-fraction-static", "0.80"]) == flag_pairs(["--mem-fraction-static", "0.8"])
    assert flag_pairs(["--c", '{"a": 1, "b": 2}']) == flag_pairs(["--c", '{"b":2,"a":1}'])
    assert flag_pairs(["--c", '{"a":1}']) != flag_pairs(["--c", '{"a":2}'])
