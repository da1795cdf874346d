"""`up FILE` of an edited file that adds or drops a role, on a running rehearsal (the simulated engine behind
the real sglang-router), under a steady load of 4 concurrent streaming chats through the router, every
answer checked (tests/stand_ins/steady_load.py): a new decode role is started and registered with the
router, then dropped (drained first); an encoder role added to a prefill/decode deployment rolls the
language workers with their new encoder list. No request fails, the roles the edit leaves alone keep their
processes, and nothing is left alive after `down`."""

from __future__ import annotations

import httpx
import pytest
from harness import free_ports
from steady_load import SteadyLoad

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

MODEL = "Qwen/Qwen3-0.6B"
REHEARSE = {"ready_after": 0.5, "itl_ms": 25}  # a 24-token stream lasts ~0.6 s: a drain has work to wait for
PROBE = {"http": "/health", "interval": 0.1, "timeout": 120}


def roles(ports: dict[str, int], long: bool = False, encoder: bool = False) -> dict:
    language = {"encoders": ["encoder"]} if encoder else {}
    out = {
        "prefill": {
            "kind": "prefill",
            "port": ports["prefill"],
            "bootstrap_port": ports["boot"],
            "ready": PROBE,
            **language,
            **({"encoder_bootstrap_port": ports["ebp"]} if encoder else {}),
        },
        "decode": {
            "kind": "decode",
            "port": ports["decode"],
            "replicas": 2,
            "ready": PROBE,
            **language,
            **({"encoder_bootstrap_port": ports["ebd"]} if encoder else {}),
        },
        "router": {
            "kind": "router",
            "port": ports["router"],
            "prefill": ["prefill"],
            "decode": ["decode", "long"] if long else ["decode"],
            "metrics_port": ports["metrics"],
        },
    }
    if long:
        out["long"] = {"kind": "decode", "port": ports["long"], "ready": PROBE, "mem_fraction": 0.7}
    if encoder:
        out["encoder"] = {"kind": "encoder", "port": ports["encoder"], "ready": PROBE}
    return out


def write(d, ports, **edit):
    return d.write(roles(ports, **edit), engine="sglang", model=MODEL, rehearse=REHEARSE)


def port_map() -> dict[str, int]:
    names = ("prefill", "decode", "decode1", "router", "boot", "metrics", "long", "encoder", "ebp", "ebd")
    return dict(zip(names, free_ports(len(names)), strict=True))


def cli_ok(d, *args) -> str:
    result = d.cli(*args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def pids(d) -> dict[str, int]:
    return {r["name"]: r["pid"] for r in d.status()["roles"]}


def listed(router_url: str) -> set[str]:
    return {w["url"] for w in httpx.get(f"{router_url}/workers", timeout=5).json()["workers"]}


def test_a_decode_role_added_then_dropped_while_it_serves(deployment):
    d = deployment
    ports = port_map()
    ports["decode1"] = ports["decode"] + 1  # the second replica's port, as the file's rules give it
    base = write(d, ports)
    cli_ok(d, "up", base, "--rehearse", "-d")
    before = pids(d)
    router_url = f"http://127.0.0.1:{ports['router']}"
    long_url = f"http://127.0.0.1:{ports['long']}"
    with_long = write(d, ports, long=True)
    dry = cli_ok(d, "up", with_long, "--rehearse", "--dry-run")
    assert "  + long (new role)" in dry.splitlines(), dry
    assert pids(d) == before
    with SteadyLoad(router_url, MODEL) as load:
        load.wait_for(4)
        out = cli_ok(d, "up", with_long, "--rehearse")
        assert f"{d.name}: applied (1 steps)" in out and "registered long (decode)" in out, out
        assert long_url in listed(router_url)
        load.wait_for(8)
        out = cli_ok(d, "up", write(d, ports), "--rehearse")  # the file as it was: the role dropped
        assert "- long" in out and "long: drained in" in out and f"{d.name}: applied (1 steps)" in out, out
        load.wait_for(4)
    assert load.failures == [] and load.ok >= 16, load.failures
    assert long_url not in listed(router_url)
    assert pids(d) == before  # prefill, both decodes and the router were never touched
    assert d.status()["state"] == "ready"
    assert "nothing to do" in cli_ok(d, "up", base, "--rehearse")
    cli_ok(d, "down", d.name)
    assert d.alive() == []


def test_an_encoder_role_added_rolls_the_language_workers_with_their_new_list(deployment):
    """prefill and decode (2 replicas) take their encoders on their command line: the new encoder starts
    first, then each language worker is relaunched with it listed (and its encoder bootstrap port), one at a
    time, so the load through the router never fails; the router is not restarted."""
    d = deployment
    ports = port_map()
    cli_ok(d, "up", write(d, ports), "--rehearse", "-d")
    before = pids(d)
    router_url = f"http://127.0.0.1:{ports['router']}"
    with SteadyLoad(router_url, MODEL) as load:
        load.wait_for(4)
        out = cli_ok(d, "up", write(d, ports, encoder=True), "--rehearse")
        load.wait_for(4)
    assert load.failures == [] and load.ok >= 8, load.failures
    assert "+ encoder" in out and f"{d.name}: applied (4 steps)" in out, out
    after = pids(d)
    assert after["router"] == before["router"]
    for name in ("prefill", "decode-0", "decode-1"):
        assert after[name] != before[name], name
    encoder_url = f"http://127.0.0.1:{ports['encoder']}"
    for port in (ports["ebp"], ports["ebd"], ports["ebd"] + 1):
        urls = httpx.get(f"http://127.0.0.1:{port}/list_encoder_urls", timeout=5).json()["encoder_urls"]
        assert [u.rstrip("/") for u in urls] == [encoder_url], (port, urls)
    assert d.status()["state"] == "ready"
    again = cli_ok(d, "up", write(d, ports, encoder=True), "--rehearse")
    assert "nothing to do" in again, out + "\n----\n" + again
    scaled = d.cli(
        "scale", d.name, "encoder", "2", timeout=120
    )  # brought in by a file, scaled as any encoder
    assert scaled.returncode == 1 and "encoder instances are not added or removed" in scaled.stderr, scaled
    with SteadyLoad(router_url, MODEL) as load:  # and dropped again: the workers first, then the encoder
        load.wait_for(4)
        out = cli_ok(d, "up", write(d, ports), "--rehearse")
        load.wait_for(4)
    assert load.failures == [], load.failures
    lines = out.splitlines()
    assert any(line.startswith("  - encoder") for line in lines) and "encoder: stopped in" in out, out
    assert "  4. unlist it from its language workers, then stop encoder" in lines, out  # after the 3 rolls
    assert "encoder" not in pids(d) and pids(d)["router"] == before["router"]
    assert d.status()["state"] == "ready"
    cli_ok(d, "down", d.name)
    assert d.alive() == []


def test_a_new_role_for_a_router_that_takes_workers_on_its_command_line_only_is_refused(deployment):
    """vllm-router in PD mode cannot be given a worker while it runs: `up` of a file adding a decode role
    says so before anything starts, and the deployment runs on as it was."""
    d = deployment
    prefill, decode, long, router, metrics, side_p, side_d, side_l = free_ports(8)

    def vllm(with_long: bool):
        roles = {
            "prefill": {"kind": "prefill", "port": prefill, "side_channel_port": side_p},
            "decode": {"kind": "decode", "port": decode, "side_channel_port": side_d},
            "router": {
                "kind": "router",
                "engine": "vllm-router",
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode", "long"] if with_long else ["decode"],
            },
        }
        if with_long:
            roles["long"] = {"kind": "decode", "port": long, "side_channel_port": side_l}
        return d.write(roles, engine="vllm", model=MODEL, rehearse=REHEARSE)

    cli_ok(d, "up", vllm(False), "--rehearse", "-d")
    before = pids(d)
    refused = d.cli("up", vllm(True), "--rehearse", timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "router (vllm-router) takes its workers on its command line only" in refused.stderr, refused.stderr
    assert "nothing was changed" in refused.stderr, refused.stderr
    assert pids(d) == before and d.status()["state"] == "ready"
    cli_ok(d, "down", d.name)
    assert d.alive() == []
