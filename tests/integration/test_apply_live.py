"""`up FILE` of an edited file on a running rehearsal (the simulated engine behind the real sglang-router),
under a steady load of 4 concurrent streaming chats through the router, every answer checked
(tests/stand_ins/steady_load.py): the difference is applied while it serves with no failed request, the
roles the edit leaves alone keep their processes, and nothing is left alive after `down`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx
import pytest
from harness import free_ports
from steady_load import SteadyLoad

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

MODEL = "Qwen/Qwen3-0.6B"
REHEARSE = {"ready_after": 0.5, "itl_ms": 25}  # a 24-token stream lasts ~0.6 s: a drain has work to wait for


def write(d, ports: list[int], decode: dict):
    prefill, decode_port, router, boot, metrics = ports
    probe = {"http": "/health", "interval": 0.1, "timeout": 120}
    return d.write(
        {
            "prefill": {"kind": "prefill", "port": prefill, "bootstrap_port": boot, "ready": probe},
            "decode": {"kind": "decode", "port": decode_port, "ready": probe, **decode},
            "router": {
                "kind": "router",
                "port": router,
                "prefill": ["prefill"],
                "decode": ["decode"],
                "metrics_port": metrics,
            },
        },
        engine="sglang",
        model=MODEL,
        rehearse=REHEARSE,
    )


def cli_ok(d, *args) -> str:
    result = d.cli(*args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def pids(d) -> dict[str, int]:
    return {r["name"]: r["pid"] for r in d.status()["roles"]}


def argv_of(d, name: str) -> list[str]:
    return next(r["argv"] for r in d.state_file()["roles"] if r["name"] == name)


def listed(router_url: str) -> set[str]:
    return {w["url"] for w in httpx.get(f"{router_url}/workers", timeout=5).json()["workers"]}


def down_clean(d) -> None:
    cli_ok(d, "down", d.name)
    assert d.alive() == []


def test_an_edited_mem_fraction_is_rolled_one_decode_at_a_time_with_no_failed_request(deployment):
    d = deployment
    ports = free_ports(5)
    cli_ok(d, "up", write(d, ports, {"replicas": 2, "mem_fraction": 0.8}), "--rehearse", "-d")
    before = pids(d)
    router_url = f"http://127.0.0.1:{ports[2]}"
    edited = write(d, ports, {"replicas": 2, "mem_fraction": 0.75})  # the same file, edited in place
    edited = edited.rename(edited.with_name("edited.yaml"))  # ... and saved under another name
    dry = cli_ok(d, "up", edited, "--rehearse", "--dry-run")
    assert "mem-fraction-static 0.8 -> 0.75" in dry and pids(d) == before, dry
    with SteadyLoad(router_url, MODEL) as load:
        load.wait_for(4)
        out = cli_ok(d, "up", edited, "--rehearse")
        assert f"{d.name}: applied (2 steps)" in out, out
        load.wait_for(4)
    assert load.failures == [] and load.ok >= 8, load.failures
    after = pids(d)
    assert after["prefill"] == before["prefill"] and after["router"] == before["router"]  # left alone
    for name in ("decode-0", "decode-1"):
        assert after[name] != before[name], name
        argv = argv_of(d, name)
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.75", argv
        assert next(r for r in d.status()["roles"] if r["name"] == name)["generation"] == 1
    assert listed(router_url) >= {f"http://127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[1] + 1}"}
    assert d.status()["state"] == "ready"
    assert d.state_file()["source"] == str(
        edited.resolve()
    )  # status names the file it runs now, not the first
    assert f";{edited.resolve()})" in "".join(cli_ok(d, "status", d.name).split())  # its title, as wrapped
    assert "nothing to do" in cli_ok(d, "up", edited, "--rehearse")  # applied: the file matches it now
    down_clean(d)


def test_one_decode_edited_is_replaced_behind_a_surge_instance_and_replicas_added(deployment):
    """One decode: a surge instance (the next replica's port) carries its traffic while it is replaced with
    the new launch; then the file's second replica is added. No request fails."""
    d = deployment
    ports = free_ports(5)
    cli_ok(d, "up", write(d, ports, {"mem_fraction": 0.8}), "--rehearse", "-d")
    before = pids(d)
    router_url = f"http://127.0.0.1:{ports[2]}"
    with SteadyLoad(router_url, MODEL) as load:
        load.wait_for(4)
        out = cli_ok(d, "up", write(d, ports, {"mem_fraction": 0.7}), "--rehearse")
        assert "carries its traffic while it is replaced" in out, out
        load.wait_for(4)
        out = cli_ok(d, "up", write(d, ports, {"mem_fraction": 0.7, "replicas": 2}), "--rehearse")
        assert "+ decode-1 (replicas 1 -> 2)" in out and "registered decode-1 (decode)" in out, out
        load.wait_for(4)
    assert load.failures == [] and load.ok >= 12, load.failures
    after = pids(d)
    assert after["decode"] != before["decode"] and after["router"] == before["router"]
    for name in ("decode", "decode-1"):
        argv = argv_of(d, name)
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.7", argv
    assert sorted(after) == ["decode", "decode-1", "prefill", "router"]
    down_clean(d)


def test_a_changed_secret_is_rolled_with_the_value_up_read_and_never_shown(deployment, monkeypatch):
    """decode's environment holds `${env:DECODE_TOKEN}`; the user exports a new value and runs `up FILE`
    again. Each decode is relaunched with the value this `up` read (not the one its supervisor was started
    with), so the next `up` has nothing to do; the new value is in no line printed and nowhere in clear in
    state.json, whose masks now hide it from `logs` and `down` as they hide the first one."""
    d = deployment
    ports = free_ports(5)
    old, new = "tok-old-8c1f2e9a77", "tok-new-5d3b0a16c4"
    monkeypatch.setenv("DECODE_TOKEN", old)
    topology = write(d, ports, {"replicas": 2, "env": {"DECODE_TOKEN": "${env:DECODE_TOKEN}"}})
    cli_ok(d, "up", topology, "--rehearse", "-d")
    before = pids(d)
    monkeypatch.setenv("DECODE_TOKEN", new)
    router_url = f"http://127.0.0.1:{ports[2]}"
    with SteadyLoad(router_url, MODEL) as load:
        load.wait_for(4)
        out = cli_ok(d, "up", topology, "--rehearse")
        assert f"{d.name}: applied (2 steps)" in out, out
        load.wait_for(4)
    assert load.failures == [], load.failures
    assert new not in out and old not in out, out
    after = pids(d)
    assert after["prefill"] == before["prefill"] and after["router"] == before["router"]
    for name in ("decode-0", "decode-1"):
        assert after[name] != before[name], name
        environ = Path(f"/proc/{after[name]}/environ").read_bytes().split(b"\0")
        assert f"DECODE_TOKEN={new}".encode() in environ, name
    assert "nothing to do" in cli_ok(d, "up", topology, "--rehearse")  # what runs is what the file says
    state = (d.run_dir / "state.json").read_text()  # raw, as a reader of the disk finds it
    assert new not in state and old not in state
    masks = json.loads(state)["masks"]
    digest = hashlib.sha256(f"{masks['salt']}\0{new}".encode()).hexdigest()
    assert digest in masks["sha256"], "the new secret is not masked in what `logs` and `down` print"
    down_clean(d)
