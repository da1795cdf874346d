"""build_plan and the `plan` formats: waves, replicas, nodes, launchers, devices, vLLM wiring."""

from __future__ import annotations

import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest
from cli_run import Ran, muse
from test_golden import flag_pairs, parse_golden

from muse_launch.engines.router import RECOVERY_DEFAULTS
from muse_launch.plan.build import build_plan
from muse_launch.plan.spec import Plan
from muse_launch.topology.load import load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]


EPD = ROOT / "topologies" / "epd-b300.yaml"


def plan_of(text: str) -> Plan:
    return build_plan(parse_topology(textwrap.dedent(text), Path("t.yaml")).topology)


def cli(*args: str) -> Ran:
    return muse(*args)


def shell_blocks(text: str) -> dict[str, str]:
    """`plan --format shell`: each `# wave N: NAME (...)` comment and the command under it."""
    out = {}
    for block in text.split("\n\n"):
        first, _, command = block.partition("\n")
        if first.startswith("# wave "):
            out[first.split(": ", 1)[1].split(" ", 1)[0]] = command
    return out


def shell_words(command: str) -> list[str]:
    """What a POSIX shell reads: backslash-newline continues the line (shlex alone keeps the newline)."""
    return shlex.split(command.replace("\\\n", ""))


def argv_of(plan: Plan, name: str) -> list[str]:
    return list(plan.spec(name).argv)


def test_epd_starts_in_three_waves() -> None:
    plan = build_plan(load_topology(EPD, environ={}).topology)
    assert plan.waves == (("encoder",), ("prefill", "decode"), ("router",))
    assert [s.name for s in plan.specs] == ["encoder", "prefill", "decode", "router"]
    assert plan.spec("router").depends_on == ("prefill", "decode")
    assert plan.stop_waves()[0] == ("router",)


REPLICAS = """
    version: 1
    name: replicas
    hardware: b300
    model: M
    roles:
      prefill: {kind: prefill, replicas: 2, gpus: 0-3, port: 30001, tp: 2, bootstrap_port: 8998}
      decode: {kind: decode, replicas: 2, gpus: [4, 5, 6, 7], port: [31000, 31010], tp: 2}
      router: {kind: router, port: 8000, prefill: [prefill], decode: [decode]}
"""


def test_replicas_split_gpus_and_step_ports() -> None:
    plan = plan_of(REPLICAS)
    assert [s.name for s in plan.specs] == ["prefill-0", "prefill-1", "decode-0", "decode-1", "router"]
    assert [plan.spec(n).gpus for n in ("prefill-0", "prefill-1", "decode-0", "decode-1")] == [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
    ]
    assert plan.spec("prefill-1").ports == {"http": 30002, "bootstrap": 8999}
    assert plan.spec("decode-1").ports == {"http": 31010}  # a list gives each replica its port
    assert plan.spec("prefill-1").env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_a_reference_to_a_replicated_role_means_all_replicas() -> None:
    plan = plan_of(REPLICAS)
    router = plan.spec("router")
    assert router.depends_on == ("prefill-0", "prefill-1", "decode-0", "decode-1")
    assert flag_pairs(router.args)[("--prefill", ("http://127.0.0.1:30001", "8998.0"))] == 1
    assert flag_pairs(router.args)[("--prefill", ("http://127.0.0.1:30002", "8999.0"))] == 1
    assert [a for a in router.args if a.startswith("http")] == [
        "http://127.0.0.1:30001",
        "http://127.0.0.1:30002",
        "http://127.0.0.1:31000",
        "http://127.0.0.1:31010",
    ]
    assert plan.waves == (("prefill-0", "prefill-1", "decode-0", "decode-1"), ("router",))


NODES = """
    version: 1
    name: nodes
    hardware: h200
    model: M
    engine: ENGINE
    host: 10.0.0.1
    nodes:
      node0: {address: 10.0.0.1}
      node1: {address: 10.0.0.2}
    roles:
      server: {kind: worker, nodes: [node0, node1], gpus: 0-7, port: 30000, PARALLEL}
"""


def test_sglang_multi_node_ranks() -> None:
    plan = plan_of(NODES.replace("ENGINE", "sglang").replace("PARALLEL", "tp: 16, dist_init_port: 5000"))
    for rank, node in enumerate(("node0", "node1")):
        spec = plan.spec(f"server@{node}")
        pairs = flag_pairs(spec.args)
        assert pairs[("--nnodes", ("2.0",))] == pairs[("--node-rank", (f"{rank}.0",))] == 1
        assert last(spec.args, "--dist-init-addr") == "10.0.0.1:5000"
        assert spec.node == node and spec.host == f"10.0.0.{rank + 1}"
    assert plan.spec("server@node0").ports == {"http": 30000, "dist_init": 5000}
    assert plan.waves == (("server@node0", "server@node1"),)


def test_vllm_multi_node_tensor_parallel_ranks() -> None:
    plan = plan_of(NODES.replace("ENGINE", "vllm").replace("PARALLEL", "tp: 8, pp: 2, dist_init_port: 29501"))
    head, worker = plan.spec("server@node0"), plan.spec("server@node1")
    for rank, spec in enumerate((head, worker)):
        assert [
            last(spec.args, f) for f in ("--nnodes", "--node-rank", "--master-addr", "--master-port")
        ] == ["2", str(rank), "10.0.0.1", "29501"]
        assert [last(spec.args, f) for f in ("--tensor-parallel-size", "--pipeline-parallel-size")] == [
            "8",
            "2",
        ]
    assert "--headless" not in head.args and head.args[-4:] == ("--host", "10.0.0.1", "--port", "30000")
    assert (
        "--headless" in worker.args and "--port" not in worker.args and worker.probe.kind.value == "process"
    )
    assert head.ports == {"http": 30000, "dist_init": 29501} and worker.ports == {}


def test_vllm_data_parallel_across_nodes() -> None:
    plan = plan_of(
        NODES.replace("ENGINE", "vllm").replace("PARALLEL", "dp: 16, ep: 16, dist_init_port: 13345")
    )
    head, worker = plan.spec("server@node0"), plan.spec("server@node1")
    for spec in (head, worker):
        assert [
            last(spec.args, f)
            for f in (
                "--data-parallel-size",
                "--data-parallel-size-local",
                "--data-parallel-address",
                "--data-parallel-rpc-port",
            )
        ] == ["16", "8", "10.0.0.1", "13345"]
        assert "--enable-expert-parallel" in spec.args and "--nnodes" not in spec.args
    assert "--data-parallel-start-rank" not in head.args
    assert last(worker.args, "--data-parallel-start-rank") == "8" and "--headless" in worker.args
    hybrid = plan_of(
        NODES.replace("ENGINE", "vllm").replace(
            "PARALLEL", "dp: 16, ep: 16, args: [--data-parallel-hybrid-lb]"
        )
    )
    node1 = hybrid.spec("server@node1")  # hybrid load balancing: every node serves its own API
    assert (
        "--headless" not in node1.args
        and node1.ports["http"] == 30000
        and node1.args[-2:] == ("--port", "30000")
    )


def test_launcher_replaces_the_program() -> None:
    plan = plan_of("""
        version: 1
        name: launchers
        hardware: b300
        model: M
        launcher: [/opt/sglang/bin/python, -m, sglang.launch_server]
        roles:
          worker: {kind: worker, gpus: 0-3, port: 30000, tp: 4}
          other: {kind: worker, gpus: 4-7, port: 30001, tp: 4, launcher: [srun, --overlap, sglang, serve]}
          router: {kind: router, port: 8000, workers: [worker, other]}
    """)
    assert argv_of(plan, "worker")[:4] == [
        "/opt/sglang/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
    ]
    assert argv_of(plan, "other")[:5] == ["srun", "--overlap", "sglang", "serve", "--model-path"]
    assert argv_of(plan, "router")[:3] == [
        "sglang-router",
        "launch",
        "--worker-urls",
    ]  # routers keep their own


def test_command_role_placeholders() -> None:
    plan = plan_of("""
        version: 1
        name: command
        hardware: b300
        host: 127.0.0.1
        bind: 0.0.0.0
        roles:
          sidecar:
            kind: command
            gpus: [2, 3]
            port: 9400
            command: [python3, -m, exporter, --listen, "{host}:{port}", --gpus, "{gpus}"]
    """)
    spec = plan.spec("sidecar")
    assert spec.argv == ("python3", "-m", "exporter", "--listen", "0.0.0.0:9400", "--gpus", "2,3")
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize(
    "hardware, variable",
    [
        ("b300", "CUDA_VISIBLE_DEVICES"),
        ("h200", "CUDA_VISIBLE_DEVICES"),
        ("mi355x", "HIP_VISIBLE_DEVICES"),
        ("mi350x", "HIP_VISIBLE_DEVICES"),
        ("xeon", None),
        ("cpu", None),
    ],
)
def test_visible_devices_variable_per_vendor(hardware: str, variable: str | None) -> None:
    plan = plan_of(f"""
        version: 1
        name: devices
        hardware: {hardware}
        model: M
        roles:
          worker: {{kind: worker, gpus: [0, 1], port: 30000, tp: 2}}
    """)
    devices = {k: v for k, v in plan.spec("worker").env.items() if k.endswith("VISIBLE_DEVICES")}
    assert devices == ({variable: "0,1"} if variable else {})


def vllm_pd(backend: str, extra: str = "", decode_extra: str = "", router: str = "vllm-router") -> str:
    return f"""
        version: 1
        name: vllm-pd
        hardware: b200
        model: M
        engine: vllm
        roles:
          prefill: {{kind: prefill, gpus: 0-3, port: 8001, tp: 4, transfer_backend: {backend}{extra}}}
          decode: {{kind: decode, gpus: 4-7, port: 8002, tp: 4, transfer_backend: {backend}{decode_extra}}}
          router: {{kind: router, engine: {router}, port: 8000, prefill: [prefill], decode: [decode]}}
    """


def test_vllm_nixl_side_channel_ports_default_apart_on_one_host() -> None:
    plan = plan_of("""
        version: 1
        name: vllm-nixl
        hardware: b200
        model: M
        engine: vllm
        roles:
          prefill: {kind: prefill, gpus: 0-1, port: 8001, dp: 2}
          decode: {kind: decode, gpus: 2-3, port: 8002, tp: 2}
          prefill2: {kind: prefill, replicas: 2, gpus: 4-5, port: 8101}
          decode2: {kind: decode, gpus: 6-7, port: 8201, tp: 2, side_channel_port: 7000}
          router: {kind: router, engine: vllm-router, port: 8000, prefill: [prefill, prefill2],
                   decode: [decode, decode2]}
    """)
    env = {
        name: plan.spec(name).env["VLLM_NIXL_SIDE_CHANNEL_PORT"]
        for name in ("prefill", "decode", "prefill2-0", "prefill2-1", "decode2")
    }
    assert env == {
        "prefill": "5600",
        "decode": "5602",
        "prefill2-0": "5603",
        "prefill2-1": "5604",
        "decode2": "7000",
    }
    assert plan.spec("prefill").ports == {"http": 8001, "side_channel": 5600, "side_channel_1": 5601}
    assert plan.spec("decode").env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    config = json.loads(last(plan.spec("prefill").args, "--kv-transfer-config"))
    assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    router = plan.spec("router")  # NIXL needs no bootstrap port at the router
    assert router.args[:5] == (
        "--vllm-pd-disaggregation",
        "--prefill",
        "http://127.0.0.1:8001",
        "--prefill",
        "http://127.0.0.1:8101",
    )
    assert "--kv-connector" not in router.args


def test_vllm_side_channels_of_a_prefill_spanning_nodes() -> None:
    plan = plan_of("""
        version: 1
        name: vllm-dep-pd
        hardware: b200
        model: M
        engine: vllm
        host: 10.0.0.1
        nodes:
          node0: {address: 10.0.0.1}
          node1: {address: 10.0.0.2}
          node2: {address: 10.0.0.3}
        roles:
          prefill: {kind: prefill, nodes: [node0, node1], gpus: 0-7, port: 8001, dp: 16, ep: 16}
          decode: {kind: decode, nodes: [node2], gpus: 0-7, port: 8002, tp: 8}
          router: {kind: router, engine: vllm-router, port: 8000, prefill: [prefill], decode: [decode]}
    """)
    head, follower = plan.spec("prefill@node0"), plan.spec("prefill@node1")
    assert head.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1"
    assert follower.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"  # each DP rank listens on its own node
    assert follower.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"  # vLLM adds the DP index
    assert sorted(follower.ports.values()) == list(range(5608, 5616)) and "http" not in follower.ports
    assert plan.spec("decode@node2").env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"  # another host
    assert plan.spec("router").args[:4] == (
        "--vllm-pd-disaggregation",
        "--prefill",
        "http://10.0.0.1:8001",
        "--decode",
    )


def test_vllm_mooncake_bootstrap_reaches_the_router() -> None:
    plan = plan_of(vllm_pd("mooncake"))
    prefill, decode, router = plan.spec("prefill"), plan.spec("decode"), plan.spec("router")
    assert json.loads(last(decode.args, "--kv-transfer-config"))["kv_connector"] == "MooncakeConnector"
    assert prefill.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "8998" and prefill.ports["bootstrap"] == 8998
    assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in decode.env and "bootstrap" not in decode.ports
    assert flag_pairs(router.args)[("--prefill", ("http://127.0.0.1:8001", "8998.0"))] == 1
    assert last(router.args, "--kv-connector") == "mooncake"
    given = plan_of(vllm_pd("mooncake", ", bootstrap_port: 9100"))
    assert given.spec("prefill").env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "9100"
    assert flag_pairs(given.spec("router").args)[("--prefill", ("http://127.0.0.1:8001", "9100.0"))] == 1


def test_vllm_example_connector_and_smg_backend() -> None:
    extra = ", kv_transfer_config: {kv_connector_extra_config: {shared_storage_path: /tmp/kv}}"
    plan = plan_of(vllm_pd("example", extra, extra, router="smg"))
    config = json.loads(last(plan.spec("decode").args, "--kv-transfer-config"))
    assert config == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": "/tmp/kv"},
    }
    assert not any(k.startswith("VLLM_") for k in plan.spec("prefill").env)
    router = plan.spec("router")
    assert router.args[:4] == ("--pd-disaggregation", "--prefill", "http://127.0.0.1:8001", "none")
    assert last(router.args, "--backend") == "vllm"


def test_vllm_host_and_port_come_last() -> None:
    plan = plan_of(vllm_pd("nixl", ", args: [--max-model-len, '32768']"))
    assert plan.spec("prefill").args[-4:] == ("--host", "127.0.0.1", "--port", "8001")
    assert plan.spec("prefill").args[0] == "M"  # `vllm serve MODEL`: positional


def test_plan_json_shape() -> None:
    run = cli("plan", str(EPD), "--format", "json")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert set(out) == {"name", "waves", "roles", "start"}
    assert out["start"]["policy"] in ("overlap", "waves") and out["start"]["after"]["router"] == [
        "prefill",
        "decode",
    ]
    assert out["name"] == "epd-b300" and out["waves"] == [["encoder"], ["prefill", "decode"], ["router"]]
    types = {
        "name": str,
        "kind": str,
        "engine": str,
        "argv": list,
        "env": dict,
        "gpus": list,
        "host": str,
        "ports": dict,
        "probe": dict,
        "depends_on": list,
    }
    for role in out["roles"]:
        assert {k: type(role[k]) for k in types} == types, role["name"]
    prefill = out["roles"][1]
    assert prefill["argv"][:2] == ["sglang", "serve"] and prefill["gpus"] == [0, 1, 2, 3]
    assert prefill["ports"] == {"http": 30001, "encoder_bootstrap": 8997, "bootstrap": 8998}
    assert prefill["env"]["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and prefill["depends_on"] == ["encoder"]
    assert out["roles"][3]["probe"]["paths"] == ["/readiness"]


def test_plan_shell_shows_the_four_cookbook_commands() -> None:
    run = cli("plan", str(EPD), "--format", "shell")
    assert run.returncode == 0, run.stderr
    blocks = shell_blocks(run.stdout)
    golden = parse_golden(ROOT / "tests" / "data" / "golden" / "epd-b300.txt")
    assert list(blocks) == ["encoder", "prefill", "decode", "router"]
    for name, command in blocks.items():
        words = shell_words(command)
        env = {}
        while re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        section = golden[name]
        if name != "router":  # a GPU role: GPU N is the same GPU to the engine and to nvidia-smi
            assert env.pop("CUDA_DEVICE_ORDER") == "PCI_BUS_ID", name
        assert env == section.env, name
        assert words[:2] == section.argv[:2], name
        got = flag_pairs(words[2:])
        got.pop(("--prometheus-port", ("29000.0",)), None)  # sglang-router's default, not printed
        if name == "router":  # muse-launch's own recovery settings, not the cookbook's
            for flag, value in RECOVERY_DEFAULTS:
                got.pop((flag, (f"{float(value)}",)), None)
        assert got == flag_pairs(section.argv[2:]), name


def test_plan_docker_uses_the_cookbook_images_and_gpu_flags() -> None:
    epd = cli("plan", str(EPD), "--format", "docker").stdout
    assert epd.count("lmsysorg/sglang:dev-muse-spark-open") == 4
    assert epd.count("--gpus all") == 3  # the router needs no GPU
    assert "-e CUDA_VISIBLE_DEVICES=4,5,6,7" in epd and "--network host" in epd
    assert "-v ~/.cache/huggingface:/root/.cache/huggingface" in epd  # unquoted, so ~ expands
    vllm = cli("plan", str(ROOT / "topologies" / "vllm-tep-b200.yaml"), "--format", "docker").stdout
    assert "vllm/vllm-openai:muse-spark-open \\\n  meta-models/Muse-Spark-Open-816B-A42B-NVFP4" in vllm
    assert "--gpus all" in vllm and "--privileged" in vllm and "vllm serve" not in vllm
    amd = cli("plan", str(ROOT / "topologies" / "mi355x-mxfp4.yaml"), "--format", "docker").stdout
    assert "lmsysorg/sglang-rocm:muse-spark-open" in amd and "--device /dev/kfd --device /dev/dri" in amd
    assert "-e HIP_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in amd
    xeon = cli("plan", str(ROOT / "topologies" / "xeon-int4.yaml"), "--format", "docker").stdout
    assert "lmsysorg/sglang:dev-muse-spark-xeon" in xeon and "--gpus" not in xeon and "/dev/kfd" not in xeon
    pd = cli("plan", str(ROOT / "topologies" / "vllm-pd-b200.yaml"), "--format", "docker").stdout
    assert "run it on the host\nvllm-router" in pd  # no image ships vllm-router
    for text in (epd, vllm, amd, xeon, pd):  # every line a shell can read
        for block in text.split("\n\n")[1:]:
            shell_words(block.partition("\n")[2])


def last(args, flag: str) -> str | None:
    found = None
    for i, arg in enumerate(args[:-1]):
        if arg == flag:
            found = args[i + 1]
    return found
