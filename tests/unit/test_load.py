"""Loading a topology file: secrets, --set, line numbers, YAML anchors and merge keys."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cli_run import Ran, muse

from muse_launch.checks import run_checks
from muse_launch.errors import TopologyError
from muse_launch.topology.load import load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]
EPD = ROOT / "topologies" / "epd-b300.yaml"
SECRET_TOKEN = "hf_s3cr3t_T0KEN_4471"
SECRET_MODEL = "private-org/unreleased-model-9"


def cli(*args: str, env: dict[str, str] | None = None) -> Ran:
    return muse(*args, env={**os.environ, **(env or {})}, cwd=ROOT)


def line_containing(text: str, needle: str, after: str | None = None) -> int:
    start = text.index(after) if after else 0
    return text.count("\n", 0, text.index(needle, start)) + 1


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- ${env:...} secrets -----------------------------------------------------------------------------


def secret_topology(tmp_path: Path) -> Path:
    text = EPD.read_text()
    text = text.replace(
        "args: [--quantization, modelopt_fp4]",
        'args: [--quantization, modelopt_fp4]\nenv: {HF_TOKEN: "${env:MUSE_TEST_HF_TOKEN}"}',
    )
    # decode serves a model named by a secret: the PD-pair check quotes it.
    text = text.replace(
        "  decode:\n    kind: decode\n", "  decode:\n    kind: decode\n    model: ${env:MUSE_TEST_MODEL}\n"
    )
    return write(tmp_path, text, "secret.yaml")


SECRETS = {"MUSE_TEST_HF_TOKEN": SECRET_TOKEN, "MUSE_TEST_MODEL": SECRET_MODEL}


def test_secrets_are_masked_in_plan_json(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        EPD.read_text().replace(
            "args: [--quantization, modelopt_fp4]",
            'args: [--quantization, modelopt_fp4]\nenv: {HF_TOKEN: "${env:MUSE_TEST_HF_TOKEN}"}',
        ),
    )
    result = cli("plan", str(path), "--format", "json", env=SECRETS)
    assert result.returncode == 0, result.stderr
    assert SECRET_TOKEN not in result.stdout + result.stderr
    plan = json.loads(result.stdout)
    assert {r["name"]: r["env"]["HF_TOKEN"] for r in plan["roles"]} == dict.fromkeys(
        ["encoder", "prefill", "decode", "router"], "***"
    )


@pytest.mark.parametrize("fmt", ["text", "shell", "docker"])
def test_secrets_are_masked_in_every_plan_format(tmp_path: Path, fmt: str) -> None:
    path = write(
        tmp_path,
        EPD.read_text().replace(
            "args: [--quantization, modelopt_fp4]",
            'args: [--quantization, modelopt_fp4]\nenv: {HF_TOKEN: "${env:MUSE_TEST_HF_TOKEN}"}',
        ),
    )
    result = cli("plan", str(path), "--format", fmt, env=SECRETS)
    assert result.returncode == 0, result.stderr
    assert SECRET_TOKEN not in result.stdout + result.stderr
    assert "***" in result.stdout


def test_secrets_are_masked_in_validate_output(tmp_path: Path) -> None:
    path = secret_topology(tmp_path)
    text_run = cli("validate", str(path), env=SECRETS)
    json_run = cli("validate", str(path), "--json", env=SECRETS)
    for run in (text_run, json_run):
        assert run.returncode == 1, run.stdout + run.stderr
        assert SECRET_MODEL not in run.stdout + run.stderr
        assert SECRET_TOKEN not in run.stdout + run.stderr
    assert "decode has model ***" in text_run.stderr
    findings = json.loads(json_run.stdout)["findings"]
    assert any(f["message"].startswith("decode has model ***") for f in findings)


def test_secrets_are_masked_in_check_failures_of_plan(tmp_path: Path) -> None:
    result = cli("plan", str(secret_topology(tmp_path)), env=SECRETS)
    assert result.returncode == 1
    assert "decode has model ***" in result.stderr
    assert SECRET_MODEL not in result.stdout + result.stderr


def test_secrets_are_masked_in_schema_errors(tmp_path: Path) -> None:
    path = write(tmp_path, EPD.read_text().replace("hardware: b300", "hardware: ${env:MUSE_TEST_HW}"))
    result = cli("validate", str(path), env={"MUSE_TEST_HW": "b300-internal-sku"})
    assert result.returncode == 2
    assert "unknown hardware '***'" in result.stderr
    assert "b300-internal-sku" not in result.stdout + result.stderr


def test_secret_values_are_substituted_and_remembered() -> None:
    text = EPD.read_text().replace("host: 127.0.0.1", "host: ${env:NODE_ADDR}")
    loaded = parse_topology(text, Path("t.yaml"), environ={"NODE_ADDR": "10.1.2.3"})
    assert loaded.topology.host == "10.1.2.3"
    assert loaded.redact("http://10.1.2.3:8000") == "http://***:8000"


def test_unset_env_names_the_variable_and_line() -> None:
    text = EPD.read_text().replace("host: 127.0.0.1", "host: ${env:NODE_ADDR}")
    with pytest.raises(TopologyError) as caught:
        parse_topology(text, Path("t.yaml"), environ={})
    assert caught.value.problems == [
        f"t.yaml:{line_containing(text, 'host: ${env')}: host: ${{env:NODE_ADDR}} is not set; "
        "export NODE_ADDR=... before running muse-launch"
    ]


# ---- --set ------------------------------------------------------------------------------------------


def argv_of(plan: dict, role: str) -> list[str]:
    return next(r["argv"] for r in plan["roles"] if r["name"] == role)


def test_set_overrides_a_key_in_plan() -> None:
    result = cli("plan", str(EPD), "--format", "json", "--set", "roles.prefill.mem_fraction=0.7")
    assert result.returncode == 0, result.stderr
    argv = argv_of(json.loads(result.stdout), "prefill")
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.7"


def test_set_parses_yaml_values_and_can_break_a_check() -> None:
    result = cli("validate", str(EPD), "--set", "roles.decode.gpus=[3, 4, 5, 6]")
    assert result.returncode == 1
    assert "roles.decode.gpus: GPU 3 is also used by prefill" in result.stderr


def test_set_adds_a_key_and_top_level_keys() -> None:
    loaded = load_topology(EPD, ["roles.decode.kv_cache_dtype=fp8_e4m3", "host=10.0.0.7"], environ={})
    assert loaded.topology.roles["decode"].kv_cache_dtype == "fp8_e4m3"
    assert loaded.topology.host == "10.0.0.7"


def test_set_under_a_mapping_the_file_shares_by_alias_changes_that_role_alone() -> None:
    """epd-b300.yaml gives prefill and decode one `env: &mooncake_nvlink` mapping; a --set of decode's
    env must not reach prefill's (nor the anchor's other users), and both keep the file's keys."""
    loaded = load_topology(EPD, ["roles.decode.env.DECODE_ONLY=1"], environ={})
    roles = loaded.topology.roles
    assert roles["decode"].env["DECODE_ONLY"] == "1"
    assert "DECODE_ONLY" not in roles["prefill"].env
    assert roles["prefill"].env["MC_INTRANODE_NVLINK"] == roles["decode"].env["MC_INTRANODE_NVLINK"]


def test_set_of_an_unknown_path_is_a_usage_error() -> None:
    result = cli("validate", str(EPD), "--set", "roles.prefil.mem_fraction=0.7")
    assert result.returncode == 2
    assert "no role 'prefil'" in result.stderr
    assert "Traceback" not in result.stderr
    result = cli("validate", str(EPD), "--set", "roles.prefill.mem_fraction")
    assert result.returncode == 2
    assert "write KEY=VALUE" in result.stderr


def test_set_value_is_checked_like_the_file() -> None:
    result = cli("validate", str(EPD), "--set", "roles.prefill.gpu=[0]")
    assert result.returncode == 2
    assert "unknown key 'gpu'; did you mean 'gpus'?" in result.stderr


# ---- line numbers -------------------------------------------------------------------------------------


def test_line_numbers_of_nested_keys() -> None:
    text = EPD.read_text()
    loaded = load_topology(EPD, environ={})
    assert loaded.line_of(("roles", "prefill")) == line_containing(text, "  prefill:\n")
    assert loaded.line_of(("roles", "prefill", "env", "SGLANG_MOONCAKE_CUSTOM_MEM_POOL")) == line_containing(
        text, "SGLANG_MOONCAKE_CUSTOM_MEM_POOL"
    )
    assert loaded.line_of(("roles", "decode", "gpus")) == line_containing(text, "gpus:", after="  decode:")
    assert loaded.line_of(("roles", "decode", "gpus", 2)) == line_containing(text, "gpus:", after="  decode:")
    assert loaded.line_of(("roles", "router", "decode", 0)) == line_containing(text, "decode: [decode]")
    # A path the file does not spell (a default) falls back to its deepest present parent.
    assert loaded.line_of(("roles", "router", "metrics_port")) == line_containing(text, "  router:")


def test_block_lists_give_each_item_its_line(tmp_path: Path) -> None:
    text = EPD.read_text().replace(
        "    gpus: [4, 5, 6, 7]\n", "    gpus:\n      - 4\n      - 5\n      - 6\n      - 9\n"
    )
    path = write(tmp_path, text)
    result = cli("validate", str(path))
    assert result.returncode == 1
    assert (
        f"{path}:{line_containing(text, '- 9')}: error: roles.decode.gpus[3]: GPU 9 does not exist"
        in result.stderr
    )


def test_schema_error_in_a_nested_key_reports_its_line(tmp_path: Path) -> None:
    text = EPD.read_text().replace("mem_fraction: 0.75", "mem_fraction: lots")
    path = write(tmp_path, text)
    result = cli("validate", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"{path}:{line_containing(text, 'mem_fraction: lots')}: "
        "roles.decode.mem_fraction: 'lots' is not valid here"
    )


# ---- anchors, aliases and merge keys ------------------------------------------------------------------


def test_cookbook_anchor_is_shared_by_decode() -> None:
    loaded = load_topology(EPD, environ={})
    roles = loaded.topology.roles
    assert roles["decode"].env == roles["prefill"].env
    assert roles["decode"].env["SGLANG_MOONCAKE_CUSTOM_MEM_POOL"] == "INTRA_NODE_NVLINK"
    result = cli("plan", str(EPD), "--format", "json")
    envs = {r["name"]: r["env"] for r in json.loads(result.stdout)["roles"]}
    assert envs["decode"]["MC_INTRANODE_NVLINK"] == "true"
    assert envs["decode"]["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


MERGED = """version: 1
name: merged
hardware: b300
model: meta-models/Muse-Spark-Open-816B-A42B-NVFP4
args: [--quantization, modelopt_fp4]
roles:
  prefill: &worker
    kind: prefill
    gpus: [0, 1, 2, 3]
    port: 30001
    tp: 4
    ep: 4
    transfer_backend: mooncake
    mem_fraction: 0.8
  decode:
    <<: *worker
    kind: decode
    gpus: [4, 5, 6, 7]
    port: 30002
  router:
    kind: router
    port: 8000
    prefill: [prefill]
    decode: [decode]
"""


def test_merge_keys_work_and_point_at_the_anchor() -> None:
    loaded = parse_topology(MERGED, Path("m.yaml"))
    decode = loaded.topology.roles["decode"]
    assert (decode.kind, decode.tp, decode.transfer_backend, decode.port) == ("decode", 4, "mooncake", 30002)
    assert run_checks(loaded)[0] == []
    # Keys the merge brings point at their definition; keys given here at their own line.
    assert loaded.line_of(("roles", "decode", "tp")) == line_containing(MERGED, "tp: 4")
    assert loaded.line_of(("roles", "decode", "port")) == line_containing(MERGED, "port: 30002")


def test_merge_keys_are_not_duplicates_and_errors_in_them_have_lines() -> None:
    text = MERGED.replace("    tp: 4\n", "    tp: four\n", 1)
    with pytest.raises(TopologyError) as caught:
        parse_topology(text, Path("m.yaml"))
    line = line_containing(text, "tp: four")
    assert f"m.yaml:{line}: roles.prefill.tp: 'four' is not valid here" in str(caught.value)
    assert f"m.yaml:{line}: roles.decode.tp: 'four' is not valid here" in str(caught.value)
    assert "given twice" not in str(caught.value)


def test_duplicate_key_names_both_lines() -> None:
    text = MERGED.replace("    port: 30002\n", "    port: 30002\n    port: 30003\n")
    with pytest.raises(TopologyError) as caught:
        parse_topology(text, Path("m.yaml"))
    assert caught.value.problems == [
        f"m.yaml:{line_containing(text, 'port: 30003')}: roles.decode.port: key given twice "
        f"(first on line {line_containing(text, 'port: 30002')}); keep one"
    ]


def test_unknown_key_inside_an_anchor_is_reported_where_it_is_written() -> None:
    text = MERGED.replace("    mem_fraction: 0.8\n", "    mem_fraction: 0.8\n    pagesize: 64\n")
    with pytest.raises(TopologyError) as caught:
        parse_topology(text, Path("m.yaml"))
    line = line_containing(text, "pagesize")
    assert (
        f"m.yaml:{line}: roles.decode.pagesize: unknown key 'pagesize'; did you mean 'page_size'?"
        in caught.value.problems
    )


def test_set_creates_a_missing_mapping_that_the_schema_then_checks() -> None:
    result = cli("plan", str(EPD), "--format", "json", "--set", "rehearse.ready_after=0.3", "--rehearse")
    assert result.returncode == 0, result.stderr
    argv = {r["name"]: r["argv"] for r in json.loads(result.stdout)["roles"]}
    assert argv["prefill"][argv["prefill"].index("--ready-after") + 1] == "0.3"
    result = cli("validate", str(EPD), "--set", "rehaerse.ready_after=0.3")
    assert result.returncode == 2 and "did you mean 'rehearse'" in result.stderr


# ---- files the loader must survive: exit 2 naming file:line, no traceback, no internal error -----------


def _epd_with(tail: bytes) -> bytes:
    return EPD.read_bytes() + tail


EPD_LINES = EPD.read_bytes().count(b"\n")


@pytest.mark.faults(
    "11. hostile files (encodings, NUL, depth, huge ints, GPU ranges, /dev/zero, FIFO, 50 MB)"
)
@pytest.mark.parametrize(
    "content, line, says",
    [
        (_epd_with("# caf\xe9\n".encode("latin-1")), EPD_LINES + 1, "not UTF-8 text (byte 0xe9)"),
        (EPD.read_text().encode("utf-16"), 1, "not UTF-8 text (it is UTF-16)"),
        (_epd_with(b"x: \x00\n"), EPD_LINES + 1, "not valid YAML: control character U+0000 is not allowed"),
        (_epd_with(b"? [a, b]\n: 1\n"), EPD_LINES + 1, "not valid YAML: found unhashable key"),
        (b"a: " + b"[" * 20000 + b"]" * 20000 + b"\n", None, "nested too deeply to be a topology file"),
        (
            EPD.read_bytes().replace(b"version: 1", b"version: " + b"9" * 5000),
            None,
            "not a topology file: Exceeds",
        ),
        (
            EPD.read_bytes().replace(b"gpus: [0, 1]\n", b"gpus: '0-999999999'\n", 1),
            16,
            "spans more than 1024 GPUs",
        ),
        (
            EPD.read_bytes().replace(b"gpus: [0, 1]\n", b"gpus: '3-0'\n", 1),
            16,
            "GPU range '3-0' runs backwards",
        ),
    ],
    ids=[
        "latin-1",
        "utf-16",
        "nul",
        "complex-key",
        "deep",
        "5000-digits",
        "huge-gpu-range",
        "backwards-range",
    ],
)
def test_a_hostile_file_is_a_bad_file(tmp_path: Path, content: bytes, line: int | None, says: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_bytes(content)
    result = cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:{line}: " in result.stderr if line else result.stderr.startswith(f"{path}: "), (
        result.stderr
    )
    assert says in result.stderr, result.stderr


# ---- values the runtime cannot use: refused by validate, exit 2 naming file:line and the key ------------


def _router_with(extra: str) -> bytes:
    text = EPD.read_text()
    if extra.startswith("    port:"):
        text = text.replace("    kind: router\n    port: 8000\n", "    kind: router\n")
    return text.replace("    kind: router\n", "    kind: router\n" + extra, 1).encode()


ROUTER_LINE = line_containing(EPD.read_text(), "kind: router") + 1  # the line _router_with adds


@pytest.mark.faults("4. stop.signal that is not a termination signal")
@pytest.mark.parametrize(
    "signal",
    [
        "SIG_DFL",
        "SIG_IGN",
        "SIG_BLOCK",
        "SIG_SETMASK",
        "SIGSTOP",
        "SIGCONT",
        "SIGCHLD",
        "SIGWINCH",
        "NSIG",
        "SIGRTMIN",
    ],
)
def test_stop_signal_must_stop_a_process(tmp_path: Path, signal: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_bytes(_router_with(f"    stop: {{signal: {signal}}}\n"))
    result = cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:{ROUTER_LINE}: roles.router.stop.signal: " in result.stderr, result.stderr
    assert "is not a signal that stops a process" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("signal", ["SIGTERM", "sigint", "QUIT", "SIGHUP", "SIGKILL", "SIGUSR1", "SIGUSR2"])
def test_stop_signal_accepts_termination_signals(signal: str) -> None:
    text = _router_with(f"    stop: {{signal: {signal}}}\n").decode()
    loaded = parse_topology(text, Path("t.yaml"))
    name = signal.upper() if signal.upper().startswith("SIG") else "SIG" + signal.upper()
    assert loaded.topology.roles["router"].stop.signal == name


@pytest.mark.faults("12. values the runtime cannot use (ports, grace, env, argv, probe path, regex)")
@pytest.mark.parametrize(
    "extra, key, says",
    [
        ("    port: 0\n", "roles.router.port", "greater than or equal to 1"),
        ("    port: 65536\n", "roles.router.port", "less than or equal to 65535"),
        ("    port: -1\n", "roles.router.port", "greater than or equal to 1"),
        ("    metrics_port: [9000, 70000]\n", "roles.router.metrics_port", "less than or equal to 65535"),
        ("    stop: {grace: .inf}\n", "roles.router.stop.grace", "finite number"),
        ("    stop: {grace: 1e9}\n", "roles.router.stop.grace", "less than or equal to 3600"),
        ("    ready: {http: /health, timeout: .inf}\n", "roles.router.ready.timeout", "finite number"),
        (
            "    env: {'A=B': x}\n",
            "roles.router.env.'A=B'",
            "environment name 'A=B': a variable is named with",
        ),
        ('    env: {"A\\0B": x}\n', "roles.router.env.'A\\x00B'", "environment name 'A\\x00B': a variable"),
        ('    env: {A: "x\\0y"}\n', "roles.router.env", "environment value of A holds a NUL"),
        ('    args: ["--x\\0y"]\n', "roles.router.args", "holds a NUL character"),
        (
            '    ready: {http: "/health\\r\\nX-Injected: 1"}\n',
            "roles.router.ready",
            "control character (CR, LF",
        ),
        ('    ready: {log: "ready (["}\n', "roles.router.ready", "is not a regular expression"),
        ("    replicas: 1000000000\n", "roles.router.replicas", "less than or equal to 256"),
        ("    logs: {max_size: lots}\n", "roles.router.logs.max_size", "cannot read size 'lots'"),
        ("    logs: {max_size: 1KiB}\n", "roles.router.logs.max_size", "greater than or equal to 65536"),
        ("    logs: {keep: -1}\n", "roles.router.logs.keep", "greater than or equal to 0"),
        ("    restart: {reset_after: .inf}\n", "roles.router.restart.reset_after", "finite number"),
    ],
    ids=[
        "port-0",
        "port-65536",
        "port-negative",
        "port-list-70000",
        "grace-inf",
        "grace-huge",
        "timeout-inf",
        "env-key-equals",
        "env-key-nul",
        "env-value-nul",
        "argv-nul",
        "probe-crlf",
        "bad-regex",
        "replicas-1e9",
        "log-size-words",
        "log-size-tiny",
        "log-keep-negative",
        "reset-after-inf",
    ],
)
def test_a_value_the_runtime_cannot_use_is_refused(tmp_path: Path, extra: str, key: str, says: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_bytes(_router_with(extra))
    result = cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{path}:{ROUTER_LINE}: {key}: " in result.stderr, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.faults("12. replica ports past 65535")
def test_replica_ports_must_not_step_past_65535(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        EPD.read_text().replace(
            "    kind: router\n    port: 8000\n",
            "    kind: router\n    port: 65535\n    replicas: 2\n    metrics_port: 9000\n",
        )
    )
    result = cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "roles.router: port 65535 steps past 65535 for 2 replicas (the last would be 65536)" in result.stderr
    )
    path.write_text(EPD.read_text().replace("    port: 8000\n", "    port: 50000\n"))
    result = cli("validate", str(path))  # the router's default metrics port, 50000 + 21000, does not exist
    assert result.returncode == 2 and "set metrics_port" in result.stderr, result.stderr


@pytest.mark.faults("12. names too long for a run directory")
@pytest.mark.parametrize(
    "old, new, key",
    [
        ("name: epd-b300", "name: " + "a" * 300, "name"),
        ("  router:\n", "  " + "r" * 300 + ":\n", "roles." + "r" * 300),
    ],
)
def test_names_fit_a_run_directory(tmp_path: Path, old: str, new: str, key: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(EPD.read_text().replace(old, new, 1))
    result = cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert f": {key}: " in result.stderr and ("63" in result.stderr), result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.faults("12. hostile --set values (recursive aliases, depth)")
@pytest.mark.parametrize(
    "value",
    [
        "&a [*a]",
        "&a {x: *a}",
        "[" * 5000 + "]" * 5000,
        "[a0: &a0 [x,x,x,x,x,x,x,x,x,x]"
        + "".join(f", a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9))
        + "]",
    ],
    ids=["recursive-list", "recursive-map", "deep", "billion-laughs"],
)
def test_a_hostile_set_value_is_a_usage_error(value: str) -> None:
    result = cli("validate", str(EPD), "--set", f"roles.router.args={value}")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("--set roles.router.args=...: "), result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


# ---- files the loader must not read whole, or at all ------------------------------------------------------


def _billion_laughs() -> bytes:
    lol = "a0: &a0 [x,x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
    )
    return EPD.read_text().replace("description:", lol + "description:", 1).encode()


@pytest.mark.faults("11. billion laughs")
def test_billion_laughs_stops_at_the_alias_limit(tmp_path: Path) -> None:
    import time

    path = tmp_path / "t.yaml"
    path.write_bytes(_billion_laughs())
    began = time.monotonic()
    result = cli("validate", str(path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"{path}:" in result.stderr and "aliases expand the file to more than 100000 values" in result.stderr
    )
    assert time.monotonic() - began < 10  # today: MemoryError after 40 s


@pytest.mark.faults("11. only a regular file of at most 1 MiB")
def test_only_a_regular_file_of_at_most_1_mib_is_read(tmp_path: Path) -> None:
    import time

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    big = tmp_path / "big.yaml"
    with big.open("wb") as out:
        out.write(EPD.read_bytes())
        out.truncate(50 * 1024 * 1024)  # 50 MB, sparse: costs no disk
    for path, says in (
        (fifo, "it is a FIFO, not a regular file"),
        (Path("/dev/zero"), "it is a device"),
        (big, f"{50 * 1024 * 1024} bytes, more than the 1048576"),
    ):
        began = time.monotonic()
        result = cli("validate", str(path))
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith(f"{path}: ") and says in result.stderr, result.stderr
        assert time.monotonic() - began < 10  # today: a FIFO hangs, /dev/zero reads 3.8 GB, 50 MB takes 46 s


def test_export_reads_the_file_under_the_same_limits(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    result = cli("export", str(fifo), "-o", str(tmp_path / "out"))
    assert result.returncode == 2 and "it is a FIFO" in result.stderr, result.stdout + result.stderr


@pytest.mark.faults("14. a short secret masked as a value, not inside URLs")
def test_a_short_secret_is_masked_as_a_value_not_inside_urls() -> None:
    text = EPD.read_text().replace(
        "    kind: router\n",
        "    kind: router\n    env: {TOKEN: '${env:T}', URL: 'http://u:${env:T}@h'}\n",
        1,
    )
    loaded = parse_topology(text, Path("t.yaml"), environ={"T": "1"})
    assert (
        loaded.redact("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    )  # today: http://***27.0.0.***:8000
    assert loaded.redact("TOKEN=1 --api-key 1") == "TOKEN=*** --api-key ***"
    assert loaded.redact("URL=http://u:1@h") == "URL=http://u:***@h"
    long = parse_topology(text, Path("t.yaml"), environ={"T": SECRET_TOKEN})
    assert long.redact(f"x{SECRET_TOKEN}y") == "x***y"


@pytest.mark.faults("14. a secret program in plan --format docker")
def test_a_secret_program_is_not_in_the_docker_comment(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        EPD.read_text().replace(
            "roles:\n",
            "roles:\n  tool:\n    kind: command\n    command: ['/opt/${env:TOOL_DIR}/run', --serve]\n",
            1,
        )
    )
    result = cli("plan", str(path), "--format", "docker", env={"TOOL_DIR": SECRET_TOKEN})
    assert result.returncode == 0, result.stderr
    assert "# no image ships /opt/***/run" in result.stdout and SECRET_TOKEN not in result.stdout


def test_log_caps_and_restart_reset_reach_the_plan(tmp_path: Path) -> None:
    from muse_launch.core import load_plan

    path = tmp_path / "t.yaml"
    path.write_bytes(_router_with("    logs: {max_size: 1.5 GiB, keep: 0}\n    restart: {reset_after: 60}\n"))
    spec = load_plan(path, []).plan.specs[-1]
    assert (spec.logs.max_size, spec.logs.keep, spec.restart.reset_after) == (int(1.5 * 1024**3), 0, 60.0)
