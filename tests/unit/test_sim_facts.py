"""The simulated engine agrees with the engine modules: the same flag spellings, choices, default
ports and KV connectors, and on every topology it binds exactly the ports the plan says."""

import json
from pathlib import Path

import pytest

from muse_launch.core import load_plan
from muse_launch.engines import sglang, vllm
from muse_launch.errors import CheckFailed
from muse_launch.sim.config import ArgvError, parse_engine_args, startup_errors
from muse_launch.sim.server import SimEngine

KEY_FLAGS = {"sglang": sglang.KEY_FLAGS, "vllm": vllm.KEY_FLAGS}

REPO = Path(__file__).resolve().parents[2]
TOPOLOGIES = sorted((REPO / "topologies").glob("*.yaml"))
M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"


def kv(connector: str, role: str = "kv_producer") -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": connector, "kv_role": role})]


def test_default_ports_are_the_engine_modules(monkeypatch):
    for var in (vllm.NIXL_SIDE_CHANNEL_PORT_ENV, vllm.MOONCAKE_BOOTSTRAP_PORT_ENV):
        monkeypatch.delenv(var, raising=False)
    c = parse_engine_args(
        "sglang", ["--model-path", M, sglang.LANGUAGE_ONLY, sglang.DISAGGREGATION_MODE, "prefill"]
    )
    assert c.bootstrap_port == sglang.DEFAULT_BOOTSTRAP_PORT
    assert c.encoder_bootstrap_port == sglang.DEFAULT_ENCODER_BOOTSTRAP_PORT
    assert (
        parse_engine_args("vllm", [M, *kv(vllm.CONNECTORS["nixl"])]).nixl_side_channel[1]
        == vllm.NIXL_SIDE_CHANNEL_BASE
    )
    assert (
        parse_engine_args("vllm", [M, *kv(vllm.CONNECTORS["mooncake"])]).mooncake_bootstrap[1]
        == vllm.MOONCAKE_BOOTSTRAP_BASE
    )
    assert parse_engine_args("vllm", [M, vllm.NNODES, "2"]).dist_init[1] == vllm.DEFAULT_MASTER_PORT


@pytest.mark.parametrize("connector", vllm.KNOWN_CONNECTORS)
def test_every_connector_vllm_has_starts(connector):
    assert startup_errors(parse_engine_args("vllm", [M, *kv(connector)])) == []


@pytest.mark.parametrize("backend", sorted(vllm.CONNECTORS))
def test_every_transfer_backend_the_renderer_writes_is_a_connector(backend):
    assert vllm.CONNECTORS[backend] in vllm.KNOWN_CONNECTORS


@pytest.mark.parametrize("connector", ["P2pNcclConnector", "SharedStorageConnector", "NoSuchConnector"])
def test_a_connector_vllm_lacks_fails_in_the_sim_and_in_the_checks(connector):
    assert connector not in vllm.KNOWN_CONNECTORS
    errs = startup_errors(parse_engine_args("vllm", [M, *kv(connector)]))
    assert errs == [f"Unsupported connector type: {connector}"]
    with pytest.raises(CheckFailed, match=f"vLLM has no KV connector {connector}"):
        load_plan(REPO / "topologies" / "vllm-pd-b200.yaml", [f"roles.prefill.transfer_backend={connector}"])


@pytest.mark.parametrize("flag", sorted(sglang.CHOICES))
def test_sglang_choices_are_the_engine_modules(flag):
    for choice in sglang.CHOICES[flag]:
        parse_engine_args("sglang", ["--model-path", M, flag, choice])
    with pytest.raises(ArgvError, match="invalid choice"):
        parse_engine_args("sglang", ["--model-path", M, flag, "no-such-choice"])


# The keys whose flags the simulator reads, with a value and the SimConfig field it lands in.
READ_KEYS = {
    "sglang": {
        "model": ("m/x", "model"),
        "tp": ("3", "tp_size"),
        "ep": ("3", "ep_size"),
        "dp": ("3", "dp_size"),
        "pp": ("3", "pp_size"),
        "page_size": ("3", "page_size"),
        "kv_cache_dtype": ("fp8_e4m3", "kv_cache_dtype"),
        "transfer_backend": ("nixl", "transfer_backend"),
        "bootstrap_port": ("3", "bootstrap_port"),
        "encoder_bootstrap_port": ("3", "encoder_bootstrap_port"),
        "encoder_transfer_backend": ("mooncake", "encoder_transfer_backend"),
    },
    "vllm": {
        "model": ("m/x", "model"),
        "tp": ("3", "tp_size"),
        "pp": ("3", "pp_size"),
        "dp": ("3", "dp_size"),
        "page_size": ("3", "page_size"),
        "kv_cache_dtype": ("fp8", "kv_cache_dtype"),
    },
}


@pytest.mark.parametrize("engine,key", [(e, k) for e in READ_KEYS for k in READ_KEYS[e]])
def test_every_spelling_of_a_key_flag_is_read(engine, key):
    value, field = READ_KEYS[engine][key]
    base = [] if key == "model" else ["--model-path", M] if engine == "sglang" else [M]
    for flag in KEY_FLAGS[engine][key]:
        c = parse_engine_args(engine, [*base, flag, value])
        assert str(getattr(c, field)) == value, (flag, getattr(c, field))


@pytest.mark.parametrize("path", TOPOLOGIES, ids=[f.stem for f in TOPOLOGIES])
def test_the_sim_binds_the_ports_the_plan_says(path, monkeypatch):
    plan = load_plan(path, rehearse=True).plan
    for spec in plan.specs:
        if "muse_launch.sim" not in spec.launcher:
            continue
        for var in (
            vllm.NIXL_SIDE_CHANNEL_HOST_ENV,
            vllm.NIXL_SIDE_CHANNEL_PORT_ENV,
            vllm.MOONCAKE_BOOTSTRAP_PORT_ENV,
        ):
            monkeypatch.delenv(var, raising=False)
        for var, value in spec.env.items():
            monkeypatch.setenv(var, value)
        engine = SimEngine(parse_engine_args(spec.engine, list(spec.args)))
        bound = sorted(port for _, _, port, _ in engine.planned_binds())
        planned = sorted(spec.ports.values())
        if spec.engine == "sglang" and spec.node and "http" not in spec.ports:
            planned = sorted([*planned, engine.cfg.port])  # SGLang ranks > 0 answer /health on their port
        assert bound == planned, spec.name
