"""argv parsing of the rehearsal engine: exactly the real engines' command lines."""

import json

import pytest

from muse_launch.sim.cli import split_argv
from muse_launch.sim.config import ArgvError, parse_engine_args, startup_errors

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"

COOKBOOK_PREFILL = [
    "--model-path",
    M,
    "--quantization",
    "modelopt_fp4",
    "--moe-runner-backend",
    "flashinfer_trtllm",
    "--tp-size",
    "4",
    "--ep-size",
    "4",
    "--mem-fraction-static",
    "0.8",
    "--language-only",
    "--encoder-urls",
    "http://127.0.0.1:30010",
    "--encoder-transfer-backend",
    "zmq_to_tokenizer",
    "--encoder-bootstrap-port",
    "8997",
    "--disaggregation-mode",
    "prefill",
    "--disaggregation-transfer-backend",
    "mooncake",
    "--disaggregation-bootstrap-port",
    "8998",
    "--reasoning-parser",
    "muse",
    "--tool-call-parser",
    "muse",
    "--host",
    "0.0.0.0",
    "--port",
    "30001",
]


def test_cookbook_prefill_argv():
    c = parse_engine_args("sglang", COOKBOOK_PREFILL)
    assert c.model == M and c.served_model_name == M
    assert (c.host, c.port, c.tp_size, c.ep_size) == ("0.0.0.0", 30001, 4, 4)
    assert c.language_only and not c.encoder_only
    assert c.encoder_urls == ["http://127.0.0.1:30010"]
    assert c.encoder_bootstrap_port == 8997
    assert c.encoder_transfer_backend == "zmq_to_tokenizer"
    assert c.disaggregation_mode == "prefill" and c.transfer_backend == "mooncake"
    assert c.bootstrap_port == 8998
    assert c.reasoning_parser == c.tool_call_parser == "muse"
    assert c.role == "prefill" and c.advertised_host == "127.0.0.1"
    assert c.binds_kv_bootstrap and c.binds_encoder_bootstrap
    # flags it does not model are kept aside, not rejected
    assert "--quantization" in c.ignored and "--mem-fraction-static" in c.ignored
    assert startup_errors(c) == []


def test_decode_binds_no_kv_bootstrap_but_encoder_bootstrap():
    argv = [a if a != "prefill" else "decode" for a in COOKBOOK_PREFILL]
    c = parse_engine_args("sglang", argv)
    assert c.role == "decode"
    assert not c.binds_kv_bootstrap
    assert c.binds_encoder_bootstrap
    c2 = parse_engine_args("sglang", argv + ["--enable-pd-role-switch"])
    assert c2.binds_kv_bootstrap


def test_encoder_and_defaults():
    c = parse_engine_args(
        "sglang", ["--model-path", M, "--tp-size", "2", "--encoder-only", "--port", "30010"]
    )
    assert c.role == "encoder" and c.encoder_only
    assert c.host == "127.0.0.1" and c.bootstrap_port == 8998
    assert c.encoder_bootstrap_port == 8997 and c.disaggregation_mode == "null"
    assert not c.binds_kv_bootstrap and not c.binds_encoder_bootstrap
    assert c.resolved_encoder_transfer_backend == "zmq_to_scheduler"


def test_multiple_encoder_urls_space_and_comma():
    c = parse_engine_args(
        "sglang",
        [
            "--model-path",
            M,
            "--language-only",
            "--encoder-urls",
            "http://a:1",
            "http://b:2,http://c:3",
            "--port",
            "1",
        ],
    )
    assert c.encoder_urls == ["http://a:1", "http://b:2", "http://c:3"]


def test_served_model_name_and_model_alias():
    c = parse_engine_args("sglang", ["--model", M, "--served-model-name", "muse"])
    assert c.model == M and c.served_model_name == "muse"


@pytest.mark.parametrize(
    "argv",
    [
        ["--model-path", M, "--disaggregation-mode", "prefil"],
        ["--model-path", M, "--disaggregation-transfer-backend", "rdma"],
        ["--model-path", M, "--encoder-transfer-backend", "zmq"],
        ["--model-path", M, "--port", "http"],
        ["--port", "30000"],
    ],
)
def test_sglang_parser_rejections(argv):
    with pytest.raises(ArgvError):
        parse_engine_args("sglang", argv)


def test_sglang_startup_rules():
    c = parse_engine_args("sglang", ["--model-path", M, "--encoder-only", "--language-only"])
    assert any("cannot be used together" in e for e in startup_errors(c))
    c = parse_engine_args("sglang", ["--model-path", M, "--encoder-only", "--disaggregation-mode", "prefill"])
    assert startup_errors(c)
    c = parse_engine_args("sglang", ["--model-path", M, "--nnodes", "2", "--node-rank", "1"])
    assert any("dist-init-addr" in e for e in startup_errors(c))


def test_vllm_positional_and_flags():
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    c = parse_engine_args(
        "vllm",
        [
            M,
            "--tensor-parallel-size",
            "8",
            "--enable-expert-parallel",
            "--reasoning-parser",
            "muse",
            "--tool-call-parser",
            "muse",
            "--enable-auto-tool-choice",
            "--port",
            "8100",
            "--kv-transfer-config",
            json.dumps(kv),
            "--max-model-len",
            "32k",
            "--speculative-config",
            "{}",
        ],
    )
    assert c.engine == "vllm" and c.model == M and c.served_model_names == [M]
    assert c.tp_size == 8 and c.ep_size == 8 and c.port == 8100 and c.host == "0.0.0.0"
    assert c.enable_auto_tool_choice and c.tool_call_parser == "muse"
    assert c.kv_connector == "NixlConnector" and c.role == "pd"
    assert c.context_length == 32000
    assert c.nixl_side_channel == ("localhost", 5600)
    assert startup_errors(c) == []


def test_vllm_api_server_form_and_served_names(monkeypatch):
    monkeypatch.setenv("VLLM_MOONCAKE_BOOTSTRAP_PORT", "9001")
    kv = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
    c = parse_engine_args(
        "vllm",
        [
            "--model",
            "/models/x",
            "--served-model-name",
            "a",
            "b",
            "--host",
            "127.0.0.1",
            "--kv-transfer-config",
            json.dumps(kv),
        ],
    )
    assert c.model == "/models/x" and c.served_model_names == ["a", "b"]
    assert c.role == "prefill" and c.mooncake_bootstrap == ("127.0.0.1", 9001)
    assert c.nixl_side_channel is None


def test_vllm_example_connector_path():
    kv = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/kvs"},
    }
    c = parse_engine_args("vllm", ["m", "--kv-transfer-config", json.dumps(kv)])
    assert c.role == "decode" and c.shared_storage_path == "/tmp/kvs"


def test_vllm_rejections_and_rules():
    with pytest.raises(ArgvError):
        parse_engine_args("vllm", ["m", "--kv-transfer-config", "{not json"])
    c = parse_engine_args("vllm", ["m", "--kv-transfer-config", '{"kv_connector": "NixlConnector"}'])
    assert any("kv_role" in e for e in startup_errors(c))
    c = parse_engine_args(
        "vllm", ["m", "--kv-transfer-config", '{"kv_connector": "NoSuchConnector", "kv_role": "kv_both"}']
    )
    assert any("Unsupported connector" in e for e in startup_errors(c))
    c = parse_engine_args("vllm", ["m", "--enable-auto-tool-choice"])
    assert any("--tool-call-parser" in e for e in startup_errors(c))


def test_split_argv():
    own, eng = split_argv(["--engine", "sglang", "--", "--model-path", "m", "--", "x"])
    assert own == ["--engine", "sglang"] and eng == ["--model-path", "m", "--", "x"]
