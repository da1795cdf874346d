"""Checks of SPEC section 3: bad-file fixtures through the real CLI, and rules on good variants.

Each tests/data/bad/*.yaml states its expected outcome in its first line:
    # expect: exit 1; [strict;] line 38; roles.decode.gpus; "GPU 3 is also used by prefill"; fix
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cli_run import Ran, muse

from muse_launch.checks import Severity, run_checks
from muse_launch.topology.load import parse_topology

ROOT = Path(__file__).resolve().parents[2]
BAD = ROOT / "tests" / "data" / "bad"
EPD = ROOT / "topologies" / "epd-b300.yaml"
BAD_FILES = sorted(BAD.glob("*.yaml"))


def validate(*args: str, env: dict[str, str] | None = None) -> Ran:
    return muse("validate", *args, env=env, cwd=ROOT)


def expectation(path: Path) -> dict:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path.name}: first line must be '# expect: ...'"
    out: dict = {"strict": False, "fix": False, "path": None, "fragments": []}
    for token in re.findall(r'\s*("[^"]*"|[^;]+)', first.removeprefix("# expect:")):
        token = token.strip()
        if token.startswith('"'):
            out["fragments"].append(token.strip('"'))
        elif token.startswith("exit "):
            out["exit"] = int(token.split()[1])
        elif token.startswith("line "):
            out["line"] = int(token.split()[1])
        elif token in ("strict", "fix"):
            out[token] = True
        elif token:
            out["path"] = token
    assert "exit" in out and "line" in out, f"{path.name}: give at least exit N and line N"
    return out


def test_enough_bad_files() -> None:
    assert len(BAD_FILES) >= 30


@pytest.mark.parametrize("bad", BAD_FILES, ids=[p.stem for p in BAD_FILES])
def test_bad_file(bad: Path) -> None:
    want = expectation(bad)
    rel = str(bad.relative_to(ROOT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MUSE_LAUNCH_TEST_UNSET")}
    result = validate(rel, *(["--strict"] if want["strict"] else []), env=env)
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    assert result.returncode == want["exit"], output
    assert f"{rel}:{want['line']}:" in output, f"expected {rel}:{want['line']}: in\n{output}"
    if want["path"]:
        assert want["path"] in output, output
    for fragment in want["fragments"]:
        assert fragment in output, f"expected {fragment!r} in\n{output}"
    if want["fix"] or want["exit"] == 1:
        assert "fix:" in output, output
    if want["exit"] == 1 and not want["strict"]:
        # The expected finding is an error on the expected line and path, not just anywhere.
        lines = [line for line in output.splitlines() if line.startswith(f"{rel}:{want['line']}: error:")]
        assert any(all(f in line for f in want["fragments"]) for line in lines), output


def test_cookbook_epd_is_clean_under_strict() -> None:
    result = validate(str(EPD.relative_to(ROOT)), "--strict")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 errors, 0 warnings" in result.stdout


def test_validate_json_is_machine_readable() -> None:
    result = validate("tests/data/bad/shared-gpus-over-budget.yaml", "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["ok"] is False
    finding = next(f for f in report["findings"] if f["path"] == "roles.decode.gpus")
    assert finding == {
        "severity": "error",
        "file": "tests/data/bad/shared-gpus-over-budget.yaml",
        "line": 38,
        "path": "roles.decode.gpus",
        "roles": ["prefill", "decode"],
        "message": finding["message"],
        "fix": finding["fix"],
    }
    assert finding["message"].startswith("GPU 3 is also used by prefill")
    assert finding["fix"].startswith("give decode GPUs 4-7")


def test_validate_json_reports_schema_errors() -> None:
    result = validate("tests/data/bad/role-key-typo.yaml", "--json")
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert any("did you mean 'gpus'" in e for e in report["errors"])


def test_validate_json_clean_file() -> None:
    result = validate(str(EPD.relative_to(ROOT)), "--json", "--strict")
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"file": str(EPD.relative_to(ROOT)), "ok": True, "findings": []}


# ---- rules on good variants of the cookbook file (no finding expected) ----------------------------


def findings_for(text: str, environ: dict[str, str] | None = None) -> list:
    loaded = parse_topology(text, Path("t.yaml"), environ=environ or {})
    findings, _ = run_checks(loaded)
    return findings


def edit(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, old
    return text.replace(old, new, count)


ARGS = "args: [--moe-runner-backend, flashinfer_trtllm, --reasoning-parser, muse, --tool-call-parser, muse"


def test_epd_has_no_findings() -> None:
    assert findings_for(EPD.read_text()) == []


def test_prefill_sequence_parallel_with_megamoe_is_accepted() -> None:
    text = edit(
        EPD.read_text(),
        ARGS,
        ARGS + ", --moe-a2a-backend, flashinfer, --enable-layernorm-sp, --enable-megamoe-for-layernorm-sp",
    )
    assert findings_for(text) == []


def test_dflash_with_fa4_on_blackwell_is_accepted() -> None:
    text = EPD.read_text()
    decode_args = text.rindex(ARGS)
    text = (
        text[:decode_args] + ARGS + ", --speculative-algorithm, DFLASH, --speculative-draft-model-path, "
        "RadixArk/Muse-Spark-Open-DFlash2, --speculative-draft-attention-backend, fa4, "
        "--speculative-num-draft-tokens, 8" + text[decode_args + len(ARGS) :]
    )
    assert findings_for(text) == []


def test_dp_attention_shares_the_tp_gpus() -> None:
    text = edit(EPD.read_text(), "    mem_fraction: 0.75\n", "    mem_fraction: 0.75\n    dp: 4\n")
    assert any("tp 4 x dp 4 x pp 1 needs 16 GPUs" in f.message for f in findings_for(text))
    text = text.replace(ARGS + "]\n  router", ARGS + ", --enable-dp-attention]\n  router")
    assert findings_for(text) == []


def test_decode_with_pd_role_switch_binds_the_bootstrap_port() -> None:
    # With --enable-pd-role-switch the decode starts a bootstrap server too: 8998 then collides.
    text = EPD.read_text()
    at = text.rindex(ARGS)
    text = text[:at] + ARGS + ", --enable-pd-role-switch" + text[at + len(ARGS) :]
    found = [f for f in findings_for(text) if f.severity is Severity.ERROR]
    assert [f.path for f in found] == [("roles", "decode", "bootstrap_port")]
    assert "KV bootstrap port 8998, already the KV bootstrap port of prefill" in found[0].message


def test_flag_in_args_counts_like_its_key() -> None:
    # The same overlap as shared-gpus-over-budget, with the budget given as an engine flag.
    text = edit(EPD.read_text(), "gpus: [4, 5, 6, 7]", "gpus: [3, 4, 5, 6]")
    text = edit(text, "    mem_fraction: 0.75\n", "")
    text = text.replace(ARGS + "]\n  router", ARGS + ", --mem-fraction-static, 0.75]\n  router")
    messages = [f.message for f in findings_for(text)]
    assert any("add up to 1.55 (prefill 0.8 + decode 0.75)" in m for m in messages), messages


def test_h200_marlin_and_two_node_bf16_are_accepted() -> None:
    for name in ("trtllm-moe-on-h200", "multi-node-loopback-node"):
        text = (BAD / f"{name}.yaml").read_text()
        text = text.replace("flashinfer_trtllm", "marlin").replace(
            "node1: {address: 127.0.0.1}", "node1: {address: 10.0.0.2}"
        )
        assert findings_for(text) == [], name


def test_vllm_pd_and_multi_node_are_accepted() -> None:
    side = (BAD / "vllm-side-channel-clash.yaml").read_text()
    at = side.rindex("side_channel_port: 5600")  # the decode's
    assert (
        findings_for(side[:at] + "side_channel_port: 5601" + side[at + len("side_channel_port: 5600") :])
        == []
    )
    nodes = (BAD / "vllm-multi-node-indivisible.yaml").read_text()
    nodes = nodes.replace("  node2: {address: 10.0.0.3}\n", "").replace(
        "[node0, node1, node2]", "[node0, node1]"
    )
    assert findings_for(nodes) == []


def test_secret_values_never_appear_in_findings() -> None:
    text = edit(EPD.read_text(), "port: 8000", "port: 8000\n    host: ${env:ROUTER_ADDR}")
    found = findings_for(text, {"ROUTER_ADDR": "0.0.0.0"})
    assert found and all(
        "0.0.0.0" not in f.format(parse_topology(text, Path("t.yaml"), environ={"ROUTER_ADDR": "0.0.0.0"}))
        for f in found
    )


def with_decode_args(text: str, extra: str) -> str:
    at = text.rindex(ARGS)  # the decode's args line
    return text[:at] + ARGS + extra + text[at + len(ARGS) :]


EXTRA_RULES = [
    # (edit of the cookbook file, severity, path, message fragment)
    (
        lambda t: edit(
            t, "    tp: 4\n    ep: 4\n    mem_fraction: 0.75", "    tp: 2\n    ep: 2\n    mem_fraction: 0.75"
        ),
        Severity.WARNING,
        ("roles", "decode", "gpus"),
        "GPUs 6-7 stay idle",
    ),
    (
        lambda t: with_decode_args(
            t, ", --speculative-algorithm, DFLASH, --speculative-draft-model-path, x/y"
        ),
        Severity.WARNING,
        ("roles", "decode", "args", 6),
        "without --speculative-draft-attention-backend",
    ),
    (
        lambda t: with_decode_args(t, ", --enable-dp-attention, --dp-size, 3"),
        Severity.ERROR,
        ("roles", "decode", "args", 7),
        "--enable-dp-attention needs dp to divide tp",
    ),
    # A top-level args flag counts where no role key overrides it (roles' tp: 4 win on prefill and decode).
    (
        lambda t: edit(
            edit(t, "    tp: 2\n", ""),
            "args: [--quantization, modelopt_fp4]",
            "args: [--quantization, modelopt_fp4, --tp-size, 8]",
        ),
        Severity.ERROR,
        ("roles", "encoder", "gpus"),
        "tp 8 x dp 1 x pp 1 needs 8 GPUs, but encoder has 2",
    ),
    (
        lambda t: edit(t, "    tp: 2\n", ""),
        Severity.WARNING,
        ("roles", "encoder", "gpus"),
        "uses 1 of encoder's 2 GPUs",
    ),
    (
        lambda t: edit(t, "port: 8000\n", "port: 8000\n    after: [router]\n"),
        Severity.ERROR,
        ("roles", "router", "after", 0),
        "router refers to itself",
    ),
    (
        lambda t: edit(t, "    decode: [decode]", "    decode: [decode, decode]"),
        Severity.ERROR,
        ("roles", "router", "decode", 1),
        "router.decode lists decode twice",
    ),
]


@pytest.mark.parametrize("change, severity, path, fragment", EXTRA_RULES)
def test_rule_on_a_variant_of_the_cookbook_file(change, severity, path, fragment) -> None:
    found = findings_for(change(EPD.read_text()))
    assert any(f.severity is severity and f.path == path and fragment in f.message for f in found), found


def test_vllm_rules() -> None:
    text = (BAD / "vllm-side-channel-clash.yaml").read_text()
    at = text.rindex("side_channel_port: 5600")
    text = text[:at] + "side_channel_port: 5601" + text[at + len("side_channel_port: 5600") :]
    dspark = text.replace(
        "    transfer_backend: nixl\n    side_channel_port: 5601",
        "    transfer_backend: nixl\n    side_channel_port: 5601\n    args: [--speculative-config, "
        '\'{"method":"dspark","model":"Inferact/Muse-Spark-Open-DSpark",'
        '"num_speculative_tokens":9}\']',
    )
    assert [f.message for f in findings_for(dspark)] == [
        "DSpark num_speculative_tokens 9: it drafts 1 to 7 tokens"
    ]
    connector = text.replace("transfer_backend: nixl", "transfer_backend: nixel")
    messages = [f.message for f in findings_for(connector)]
    assert "vLLM has no KV connector nixel" in messages


def test_xeon_page_size() -> None:
    text = (BAD / "gpus-on-cpu-profile.yaml").read_text().replace("    gpus: [0, 1]\n", "")
    assert findings_for(text) == []
    found = findings_for(text.replace("page_size: 1", "page_size: 16"))
    assert [(f.severity, f.path) for f in found] == [(Severity.WARNING, ("roles", "worker", "page_size"))]


def test_replicas_stepping_onto_the_routers_port_are_a_finding_not_an_internal_error():
    """256 prefills and decodes step their ports over the router's: the router's URL is no worker (this read
    the router as a decode and ended in an internal error, exit 70)."""
    text = (ROOT / "examples" / "pd-vllm-cpu.yaml").read_text()
    text = edit(text, "kind: prefill", "kind: prefill\n    replicas: 256")
    text = edit(text, "kind: decode", "kind: decode\n    replicas: 256")
    findings = findings_for(text, {"MUSE_LAUNCH_VLLM_PYTHON": "/x/python", "MUSE_LAUNCH_TINY_MODEL": "/x/m"})
    assert any("already the HTTP port of" in f.message for f in findings), findings
