"""The engine check against the released parsers: sglang 0.5.23 and vllm 0.33.0, installed on the CPU
by scripts/install_engine_parsers.sh (scripts/test.sh runs it first), and the real routers.

Without that venv these tests FAIL: CI must not pass by skipping the check of every command. The
venv is found as the install script puts it: ${MUSE_LAUNCH_PARSERS_VENV:-$HOME/.cache/muse-launch/
engine-parsers-venv}; its bin directory goes first on PATH, as an engine host has `sglang` and `vllm`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from muse_launch.checks import Severity, engine
from muse_launch.plan.build import build_plan
from muse_launch.topology.load import LoadedTopology, dotted, load_topology

pytestmark = [pytest.mark.engine_parsers, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((ROOT / "topologies").glob("*.yaml"))
VENV = Path(
    os.environ.get("MUSE_LAUNCH_PARSERS_VENV") or Path.home() / ".cache/muse-launch/engine-parsers-venv"
)


@pytest.fixture(scope="session")
def parsers_bin() -> Path:
    bin_dir = VENV / "bin"
    for program in ("python", "sglang", "vllm"):
        assert (bin_dir / program).exists(), (
            f"{bin_dir / program} is missing: run scripts/install_engine_parsers.sh (scripts/test.sh does)"
        )
    return bin_dir


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache of their own: every test parses for real (a pass is remembered only within the session)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def engine_path(parsers_bin: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The parsers' venv first on PATH, then this interpreter's (the real routers), then the rest."""
    path = os.pathsep.join([str(parsers_bin), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    return path


def run_check(path: Path, sets: tuple[str, ...] = ()) -> tuple[engine.EngineCheckResult, LoadedTopology]:
    loaded = load_topology(path, sets)
    return engine.check(build_plan(loaded.topology), loaded), loaded


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def line_of(path: Path, needle: str) -> int:
    text = path.read_text()
    return text.count("\n", 0, text.index(needle)) + 1


def only(result: engine.EngineCheckResult, role: str):
    found = [f for f in result.findings if role in f.roles]
    assert len(found) == 1, [f.message for f in result.findings]
    return found[0]


# ---- every recipe passes ---------------------------------------------------------------------


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[p.stem for p in TOPOLOGIES])
def test_every_topology_passes_the_released_parsers(path: Path, engine_path: str) -> None:
    result, loaded = run_check(path)
    errors = [f.format(loaded) for f in result.findings if f.severity is Severity.ERROR]
    assert not errors, "\n".join(errors + list(result.notes))
    for warning in (f for f in result.findings if f.severity is Severity.WARNING):
        assert "the recipe's own text" in warning.message, warning.format(loaded)  # only recipe refusals warn
    engines = {s.engine for s in build_plan(loaded.topology).specs}
    assert not any("skipped" in n for n in result.notes), result.notes
    for name in engines & {"sglang", "vllm"}:
        version = {"sglang": "0.5.23", "vllm": "0.33.0"}[name]
        assert any(n.startswith(f"engine check: {name} {version} ") for n in result.notes), result.notes


# ---- wrong arguments: the engine's own message, the role and the line --------------------------

SGLANG_BAD = """
    version: 1
    name: bad-sglang
    hardware: b300
    model: meta-models/Muse-Spark-Open-816B-A42B-NVFP4
    engine: sglang
    args: [--quantization, modelopt_fp4]
    roles:
      prefill:
        kind: prefill
        gpus: [0, 1, 2, 3]
        port: 30001
        tp: 4
        transfer_backend: mooncack            # invalid choice, from a key
      decode:
        kind: decode
        gpus: [4, 5]
        port: 30002
        tp: 2
        args: [--reasoning-parser, muse, --max-running-requests, lots]   # wrong type
      decode2:
        kind: decode
        gpus: [6, 7]
        port: 30003
        tp: 2
        args: [--enable-layernorm-spp]        # unknown flag
      router:
        kind: router
        port: 8000
        prefill: [prefill]
        decode: [decode, decode2]
        args: [--policy, fastest]             # the router's own choices
"""


def test_sglang_and_router_rejections(tmp_path: Path, engine_path: str) -> None:
    path = write(tmp_path, SGLANG_BAD)
    result, loaded = run_check(path)
    choice = only(result, "prefill")
    assert choice.severity is Severity.ERROR and choice.path == ("roles", "prefill", "transfer_backend")
    assert loaded.line_of(choice.path) == line_of(path, "transfer_backend: mooncack")
    assert (
        "sglang 0.5.23 refuses the command: argument --disaggregation-transfer-backend: invalid choice: "
        "'mooncack'" in choice.message
    )

    wrong_type = only(result, "decode")
    assert wrong_type.path == ("roles", "decode", "args", 2)
    assert loaded.line_of(wrong_type.path) == line_of(path, "--max-running-requests, lots")
    assert "argument --max-running-requests: invalid int value: 'lots'" in wrong_type.message

    unknown = only(result, "decode2")
    assert unknown.path == ("roles", "decode2", "args", 0)
    assert "unrecognized arguments: --enable-layernorm-spp" in unknown.message
    assert unknown.fix == "did you mean --enable-layernorm-sp?"

    policy = only(result, "router")
    assert policy.path == ("roles", "router", "args", 0)
    assert (
        "sglang-router 0.3.2 refuses the command: argument --policy: invalid choice: 'fastest'"
        in policy.message
    )
    text = choice.format(loaded)
    assert text.startswith(
        f"{path}:{loaded.line_of(choice.path)}: error: roles.prefill.transfer_backend: prefill: "
    )


VLLM_BAD = """
    version: 1
    name: bad-vllm
    hardware: b200
    model: meta-models/Muse-Spark-Open-816B-A42B-NVFP4
    engine: vllm
    args: [--max-model-len, "32768"]
    roles:
      prefill:
        kind: prefill
        gpus: [0, 1]
        port: 8001
        tp: 2
        kv_transfer_config: {kv_role: producer}          # a bad --kv-transfer-config, from a key
      decode:
        kind: decode
        gpus: [2, 3]
        port: 8002
        tp: 2
        args:
          - --speculative-config
          - '{"method":"dspark","model":"Inferact/Muse-Spark-Open-DSpark","num_speculative_tokens":"seven"}'
      decode2:
        kind: decode
        gpus: [4, 5]
        port: 8003
        tp: 2
        transfer_backend: NixConnector                   # no such connector
      decode3:
        kind: decode
        gpus: [6, 7]
        port: 8004
        tp: 2
        args: [--max-num-sequences, "128"]  # unknown flag (a prefix would pass: argparse abbreviates)
      router:
        kind: router
        engine: vllm-router
        port: 8000
        prefill: [prefill]
        decode: [decode, decode2, decode3]
"""


def test_vllm_rejections(tmp_path: Path, engine_path: str) -> None:
    path = write(tmp_path, VLLM_BAD)
    result, loaded = run_check(path)
    kv = only(result, "prefill")
    assert kv.path == ("roles", "prefill", "kv_transfer_config")
    assert loaded.line_of(kv.path) == line_of(path, "kv_transfer_config: {kv_role")
    assert (
        "vllm 0.33.0 refuses the command: argument --kv-transfer-config: 1 validation error for "
        "KVTransferConfig kv_role Input should be 'kv_producer', 'kv_both' or 'kv_consumer'" in kv.message
    )

    spec = only(result, "decode")
    assert spec.path == ("roles", "decode", "args", 0)
    assert (
        "argument --speculative-config: 1 validation error for SpeculativeConfig num_speculative_tokens "
        "Input should be a valid integer" in spec.message
    )

    connector = only(result, "decode2")
    assert connector.path == ("roles", "decode2", "transfer_backend")
    assert "unknown kv_connector 'NixConnector'" in connector.message and "NixlConnector" in connector.message
    assert connector.fix == "did you mean NixlConnector?"

    unknown = only(result, "decode3")
    assert unknown.path == ("roles", "decode3", "args", 0)
    assert "unrecognized arguments: --max-num-sequences 128" in unknown.message
    assert unknown.fix == "did you mean --max-num-seqs?"
    assert not [f for f in result.findings if "router" in f.roles]  # vllm-router's own --help has them all


def test_top_level_args_are_blamed_on_their_line(tmp_path: Path, engine_path: str) -> None:
    path = write(
        tmp_path,
        SGLANG_BAD.replace(
            "args: [--quantization, modelopt_fp4]", "args: [--quantization, modelopt_fp4, --page-size, big]"
        ),
    )
    result, loaded = run_check(path)
    top = [f for f in result.findings if f.path == ("args", 2)]
    assert len(top) == 1 and set(top[0].roles) == {"prefill", "decode", "decode2"}, result.findings
    assert "argument --page-size: invalid int value: 'big'" in top[0].message
    assert loaded.line_of(top[0].path) == line_of(path, "args: [--quantization")


def test_recipe_text_the_release_refuses_is_a_warning_naming_the_recipe(
    tmp_path: Path, engine_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm 0.33.0 accepts the AMD DSpark config as topologies/ has it (checked above); a refusal of
    recipe text is reported as a warning, here with a value 0.33.0 refuses."""
    text = (
        (ROOT / "topologies" / "vllm-tep-mi355x.yaml")
        .read_text()
        .replace('"attention_backend":"ROCM_AITER_FA"', '"attention_backend":"ROCM_AITER_FA_V9"')
    )
    path = tmp_path / "mi355x.yaml"
    path.write_text(text)
    result, loaded = run_check(path)
    (finding,) = result.findings
    assert finding.severity is Severity.WARNING and finding.path[:3] == ("roles", "server", "args")
    assert "Unknown attention backend: 'ROCM_AITER_FA_V9'" in finding.message
    assert "the recipe's own text, from the vLLM recipe's AMD DSpark mode" in finding.message


def test_a_pass_is_remembered_until_the_command_or_the_install_changes(
    tmp_path: Path, engine_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = ROOT / "topologies" / "epd-b300.yaml"
    first, _ = run_check(path)
    assert any(n.endswith("accepts 3 commands of 3") for n in first.notes), first.notes
    again = engine.start(build_plan(load_topology(path).topology), load_topology(path))
    assert not any(b.process for b in again.batches.values())  # no parser process at all
    assert any(n.endswith("accepts 3 commands of 3 (as it did before)") for n in again.result().notes)
    changed, _ = run_check(path, ("roles.decode.mem_fraction=0.7",))  # decode's command is new: parsed
    assert any(n.endswith("accepts 3 commands of 3") for n in changed.notes), changed.notes
    monkeypatch.setenv("MUSE_LAUNCH_ENGINE_CHECK_CACHE", "0")
    off = engine.start(build_plan(load_topology(path).topology), load_topology(path))
    assert all(b.process for b in off.batches.values())
    off.result()


# ---- where the engine is not here ----------------------------------------------------------------


def test_an_engine_that_cannot_be_imported_is_skipped_with_one_line(
    tmp_path: Path, engine_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, SGLANG_BAD)
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no sglang here, the routers are
    result, _ = run_check(path)
    assert [n for n in result.notes if "skipped" in n] == [
        "engine check: skipped prefill, decode, decode2 (sglang): `sglang` is not on PATH"
    ]
    # an interpreter without the engine: its parser process says so
    result, _ = run_check(path, (f"launcher=[{sys.executable}, -m, sglang.launch_server]",))
    (note,) = [n for n in result.notes if "skipped" in n]
    assert note.startswith(
        f"engine check: skipped prefill, decode, decode2: sglang cannot be imported by {sys.executable}"
    )
    assert [f.roles for f in result.findings] == [("router",)]  # the router is still checked


def test_a_router_behind_a_wrapper_is_skipped_not_judged_by_the_wrappers_help(
    tmp_path: Path, engine_path: str
) -> None:
    """A launcher that is not the router's program (a wrapper, a stand-in) prints its own --help: the
    router's options are not in it, so the router is skipped with one line instead of refused."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import argparse\nargparse.ArgumentParser().parse_args()\n")
    path = write(tmp_path, SGLANG_BAD)
    result, _ = run_check(path, (f"roles.router.launcher=[{sys.executable}, {wrapper}]",))
    assert not [f for f in result.findings if "router" in f.roles], [f.message for f in result.findings]
    assert any("skipped router" in n and "runs no module" in n for n in result.notes), result.notes


# ---- through the CLI ------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "muse_launch", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


UP_BAD = """
    version: 1
    name: bad-sglang
    hardware: b300
    model: Qwen/Qwen3-8B
    engine: sglang
    roles:
      prefill: {kind: prefill, gpus: [0], port: 30001}
      decode:
        kind: decode
        gpus: [1]
        port: 30002
        args: [--reasoning-parser, qwen3, --max-running-requests, lots]
      router: {kind: router, port: 8000, prefill: [prefill], decode: [decode]}
"""


def test_validate_engine_check_and_up_refuse_before_starting(tmp_path: Path, engine_path: str) -> None:
    env = {**os.environ, "PATH": engine_path, "MUSE_LAUNCH_HOME": str(tmp_path / "home")}
    good = cli("validate", "topologies/epd-b300.yaml", "--engine-check", env=env)
    assert good.returncode == 0, good.stderr
    assert "engine check: sglang 0.5.23" in good.stderr and "accepts 3 commands of 3" in good.stderr

    path = write(tmp_path, UP_BAD)
    plain = cli("validate", str(path), env=env)  # the other checks find nothing; the parsers are not asked
    assert plain.returncode == 0 and "refuses" not in plain.stderr, plain.stderr
    bad = cli("validate", str(path), "--engine-check", env=env)
    assert bad.returncode == 1
    assert (
        f"{path}:{line_of(path, '--max-running-requests')}: error: roles.decode.args[2]: decode: sglang "
        "0.5.23 "
        f"refuses the command: argument --max-running-requests: invalid int value: 'lots'" in bad.stderr
    )

    up = cli("up", str(path), "--detach", env=env)
    assert up.returncode == 1, up.stdout + up.stderr
    assert "invalid int value: 'lots'" in up.stderr and "starting" not in up.stdout
    assert not (tmp_path / "home" / "bad-sglang" / "state.json").exists()  # nothing started


def test_plan_shows_the_installed_versions(engine_path: str) -> None:
    env = {**os.environ, "PATH": engine_path}
    out = cli("plan", "topologies/epd-b300.yaml", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == "installed here: sglang 0.5.23, sglang-router 0.3.2"
    assert dotted(("roles", "x")) == "roles.x"
