"""Where `scale` and a restart's surge put a new instance on an 8xB300 host, rehearsed: exactly one
instance's GPUs, from those no instance of any deployment holds, as a real host would place them; where
there is no room, refused before anything starts, with a fix that works when typed. After every change the
layout is one a real host accepts: no GPU or port held twice, each instance on tp GPUs, and the router lists
exactly the instances serving."""

from __future__ import annotations

import httpx
import pytest
import yaml
from harness import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

MODEL = "Qwen/Qwen3-0.6B"


def b300_pd(d, ports: list[int], decode_replicas: int = 2, name: str | None = None):
    """prefill TP2 on GPUs 0-1, decode TP2 x `decode_replicas` from GPU 2 up: GPUs 6-7 free with 2."""
    prefill, decode, router, boot, metrics = ports[:5]
    probe = {"http": "/health", "interval": 0.1, "timeout": 120}
    roles = {
        "prefill": {
            "kind": "prefill",
            "gpus": [0, 1],
            "tp": 2,
            "port": prefill,
            "bootstrap_port": boot,
            "ready": probe,
        },
        "decode": {
            "kind": "decode",
            "gpus": list(range(2, 2 + 2 * decode_replicas)),
            "tp": 2,
            "port": decode,
            "replicas": decode_replicas,
            "ready": probe,
        },
        "router": {
            "kind": "router",
            "port": router,
            "metrics_port": metrics,
            "prefill": ["prefill"],
            "decode": ["decode"],
        },
    }
    top = {"engine": "sglang", "model": MODEL, "hardware": "b300", "rehearse": {"ready_after": 0.3}}
    if name is None:
        return d.write(roles, **top)
    path = d.home.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": name, **top, "roles": roles}))
    return path


def ok(d, *args) -> str:
    result = d.cli(*args, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def sound(d, router_port: int) -> dict[str, dict]:
    """The layout checks a real host makes, and the router's list: returns the roles by name."""
    status = d.status()
    roles = {r["name"]: r for r in status["roles"]}
    gpus = [g for r in roles.values() for g in r["gpus"]]
    assert len(gpus) == len(set(gpus)), f"a GPU held twice: {[(n, r['gpus']) for n, r in roles.items()]}"
    ports = [p for r in roles.values() for p in r["ports"].values()]
    assert len(ports) == len(set(ports)), f"a port held twice: {[(n, r['ports']) for n, r in roles.items()]}"
    for name, role in roles.items():
        if role["kind"] in ("prefill", "decode"):
            assert len(role["gpus"]) == 2, (name, role["gpus"])  # tp 2
            assert role["state"] == "ready", (name, role["state"])
    answer = httpx.get(f"http://127.0.0.1:{router_port}/workers", timeout=5).json()
    listed = sorted(w["url"] for w in answer["workers"])
    serving = sorted(r["url"] for r in roles.values() if r["kind"] in ("prefill", "decode"))
    assert listed == serving
    assert status["change"] is None
    return roles


def test_scale_takes_free_gpus_refuses_what_a_real_host_refuses_and_its_fix_works(deployment):
    d = deployment
    ports = free_ports(5)
    ok(d, "up", b300_pd(d, ports), "--rehearse", "-d")
    out = ok(d, "scale", d.name, "decode", "3")  # 2 -> 3: the third on the free GPUs 6-7, both others kept
    assert "decode: 2 -> 3 instances" in out and "(decode-0, decode-1, decode-2)" in out, out
    roles = sound(d, ports[2])
    assert [roles[n]["gpus"] for n in ("decode-0", "decode-1", "decode-2")] == [[2, 3], [4, 5], [6, 7]]

    full = d.cli("scale", d.name, "decode", "4")  # no GPU left
    assert full.returncode == 1, full.stdout + full.stderr
    assert (
        "decode-3: no room on this host: one instance of decode needs 2 GPUs; free: none of 8" in full.stderr
    )
    assert "GPU 6-7: decode-2" in full.stderr and "Nothing was started" in full.stderr
    assert "PlanError" not in full.stderr and "Traceback" not in full.stderr
    assert sorted(sound(d, ports[2])) == ["decode-0", "decode-1", "decode-2", "prefill", "router"]

    out = ok(d, "scale", d.name, "decode", "1")  # the highest replicas leave first
    assert "(decode-0)" in out and "decode-2: stopped" in out and "decode-1: stopped" in out, out
    out = ok(d, "scale", d.name, "decode", "3")  # the file's own GPUs for each replica again
    roles = sound(d, ports[2])
    assert [roles[n]["gpus"] for n in ("decode-0", "decode-1", "decode-2")] == [[2, 3], [4, 5], [6, 7]]

    refused = d.cli("scale", d.name, "prefill", "2")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    fix = f"muse-launch scale {d.name} decode 2"
    assert f"`{fix}` frees 2" in refused.stderr, refused.stderr
    ok(d, *fix.split()[1:])  # the fix, as printed
    out = ok(d, "scale", d.name, "prefill", "2")
    roles = sound(d, ports[2])
    assert roles["prefill-1"]["gpus"] == [6, 7], roles["prefill-1"]
    ok(d, "down", d.name)
    assert d.alive() == []


def test_a_scale_with_room_for_fewer_than_asked_starts_nothing(deployment):
    d = deployment
    ports = free_ports(5)
    ok(d, "up", b300_pd(d, ports), "--rehearse", "-d")
    result = d.cli("scale", d.name, "decode", "4")  # room for one more (GPUs 6-7), not two
    assert result.returncode == 1, result.stdout + result.stderr
    assert "scale decode 2 -> 4: room for 1 more (decode-2); decode-3: no room" in result.stderr
    assert "started" not in result.stdout, result.stdout
    assert sorted(sound(d, ports[2])) == ["decode-0", "decode-1", "prefill", "router"]
    for bad, why in (("0", "`down` stops it all"), ("257", "from 1 to 256"), ("٣", "from 1 to 256")):
        refused = d.cli("scale", d.name, "decode", bad)
        assert refused.returncode == 2 and why in refused.stderr, refused.stdout + refused.stderr
    ok(d, "down", d.name)
    assert d.alive() == []


def test_another_deployments_gpus_are_held_and_the_fix_names_it(deployment):
    d = deployment
    ports, theirs = free_ports(5), free_ports(5)
    other = b300_pd(d, theirs, decode_replicas=1, name="other")  # GPUs 0-3 as written
    ok(d, "up", b300_pd(d, ports, decode_replicas=1), "--rehearse", "-d")  # GPUs 0-3
    try:
        clash = d.cli("up", other, "--rehearse", "-d")  # as a real host refuses two engines on one GPU
        assert clash.returncode == 1, clash.stdout + clash.stderr
        assert f"prefill is planned on GPU 0-1, which prefill of {d.name} holds" in clash.stderr
        assert f"`muse-launch down {d.name}`" in clash.stderr and "nothing was started" in clash.stderr
        text = yaml.safe_load(other.read_text())
        text["roles"]["prefill"]["gpus"], text["roles"]["decode"]["gpus"] = [6, 7], [4, 5]
        other.write_text(yaml.safe_dump(text))
        ok(d, "up", other, "--rehearse", "-d")  # GPUs 4-7
        refused = d.cli("scale", d.name, "decode", "2")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "GPU 4-5: decode of other" in refused.stderr and "GPU 6-7: prefill of other" in refused.stderr
        assert "`muse-launch down other`" in refused.stderr, refused.stderr
        ok(d, "down", "other")
        ok(d, "scale", d.name, "decode", "2")  # the fix, then the change
        assert sound(d, ports[2])["decode-1"]["gpus"] == [4, 5]
    finally:
        d.cli("down", "other")
    ok(d, "down", d.name)
    assert d.alive() == []
