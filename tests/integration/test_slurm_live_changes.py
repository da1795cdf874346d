"""`scale` on SLURM (the real local cluster of scripts/slurm_local.sh): decode 1 -> 2 -> 1 as a new job step
and back, under a steady load of streaming chats through the real sglang-router, with no failed request and
nothing left after `down` (no step, no job, no process, no port); and a scale past the allocation's GPUs
refused with the node and what it lacks, nothing changed."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from harness import REPO, Deployment, wait_for
from rehearsal import tails
from steady_load import SteadyLoad
from test_slurm import assert_nothing_left, cancel_and_kill, cluster, job_id, squeue  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.integration]

MODEL = "Qwen/Qwen3-0.6B"


EXAMPLE = REPO / "examples" / "slurm-scale.yaml"  # prefill and router on n0, decode (1 GPU) on n1


def topology(d: Deployment, decode_gpus: list[int] = [0]):  # noqa: B006
    """The example file, its decode given `decode_gpus`, written beside the deployment's home."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["name"] = d.name
    data["roles"]["decode"]["gpus"] = decode_gpus
    path = d.home.parent / f"{d.name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def up(d: Deployment, *sbatch: str, decode_gpus: list[int] = [0]) -> None:  # noqa: B006
    result = d.cli("up", topology(d, decode_gpus), "--on", "slurm", "--rehearse", "-d", *sbatch, timeout=240)
    if result.returncode != 0:
        cancel_and_kill(d)
        raise AssertionError(f"up: {result.stdout}{result.stderr}\n{tails(d)}")


def steps(job: str) -> list[str]:
    return sorted(line.split()[1] for line in squeue("--steps", "--jobs", job, "--format", "%i %j"))


def listed(router_url: str) -> set[str]:
    return {w["url"] for w in httpx.get(f"{router_url}/workers", timeout=5).json()["workers"]}


def test_scale_decode_1_2_1_on_slurm_under_load_fails_no_request(cluster, tmp_path):  # noqa: F811
    d = Deployment(tmp_path / "home", "live-slurm")
    d.home.mkdir()
    up(d, "--sbatch=--gres=gpu:2")  # two GPUs a node: room for a second decode on n1
    try:
        job = job_id(d)
        router_url = d.role("router")["url"]
        decode = d.role("decode")
        node = decode["node"]  # SLURM's name of the allocation's second node
        with SteadyLoad(router_url, MODEL) as load:
            load.wait_for(4)
            scaled = d.cli("scale", d.name, "decode", "2", timeout=300)
            assert scaled.returncode == 0, f"{scaled.stdout}{scaled.stderr}\n{tails(d)}"
            assert f"decode-1: placed on {node} (1 GPU)" in scaled.stdout, scaled.stdout
            assert "registered decode-1 (decode)" in scaled.stdout and "decode: 1 -> 2" in scaled.stdout
            new = d.role("decode-1")
            assert new["state"] == "ready" and new["generation"] == 0
            assert new["url"] in listed(router_url) and decode["url"] in listed(router_url)
            assert "decode-1" in steps(job)
            status = d.status()
            assert {r["name"]: r["node"] for r in status["roles"]}["decode-1"] == node, status
            load.wait_for(4)
            steps_before = steps(job)
            rolled = d.cli("restart", d.name, "decode", "--rolling", timeout=300)
            assert rolled.returncode == 0, f"{rolled.stdout}{rolled.stderr}\n{tails(d)}"
            assert "decode: 2 restarted" in rolled.stdout, rolled.stdout
            roles = {r["name"]: r for r in d.status()["roles"]}
            assert roles["decode"]["generation"] == roles["decode-1"]["generation"] == 1, roles
            assert roles["router"]["generation"] == 0
            assert steps(job) == steps_before  # the same step names, each a fresh step
            load.wait_for(8)
            back = d.cli("scale", d.name, "decode", "1", timeout=300)
            assert back.returncode == 0, f"{back.stdout}{back.stderr}\n{tails(d)}"
            assert "router: removed decode-1" in back.stdout and "decode-1: drained in" in back.stdout
            assert new["url"] not in listed(router_url)
            wait_for(lambda: "decode-1" not in steps(job), timeout=60)
            load.wait_for(4)
        assert load.failures == [] and load.ok >= 16, load.failures
        assert sorted(r["name"] for r in d.status()["roles"]) == ["decode", "prefill", "router"]
        assert d.status()["change"] is None
        down = d.cli("down", d.name, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert_nothing_left(d, job)
        assert not d.ports_held()
    finally:
        cancel_and_kill(d)


def test_a_scale_past_the_allocation_is_refused_with_the_node_and_nothing_changes(cluster, tmp_path):  # noqa: F811
    d = Deployment(tmp_path / "home", "live-slurm")
    d.home.mkdir()
    up(d, decode_gpus=[0, 1, 2, 3, 4])  # 5 GPUs: a second one would need 10 on its node
    try:
        job = job_id(d)
        before = d.status()
        node = d.role("decode")["node"]
        before_steps = steps(job)
        refused = d.cli("scale", d.name, "decode", "2", timeout=300)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        err = refused.stderr
        said = re.search(
            rf"decode-1: node {node} has (\d+) of its (\d+) allocated GPUs free \(held: decode 5\)", err
        )
        assert said and int(said[2]) - 5 == int(said[1]) < 5, err
        assert (
            "decode-1 needs 5" in err and "--sbatch=--gres=gpu:10" in err and "--sbatch=--nodes=N" in err
        ), err
        after = d.status()
        assert [(r["name"], r["pid"], r["state"]) for r in after["roles"]] == [
            (r["name"], r["pid"], r["state"]) for r in before["roles"]
        ]
        assert after["change"] is None and steps(job) == before_steps
        smoke = d.cli("smoke", d.name, "--timeout", "60", timeout=120)
        assert smoke.returncode == 0, smoke.stdout
        down = d.cli("down", d.name, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert_nothing_left(d, job)
    finally:
        cancel_and_kill(d)


def test_an_edited_file_is_rolled_on_slurm_and_what_it_cannot_carry_is_refused(
    cluster,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """`up FILE --on slurm` of the running job: decode's new mem_fraction is rolled (its only instance,
    behind a surge step on its node) under a steady load with no failed request; then the same file has
    nothing to do. A new `${env:...}` value (requests are files: it is never written down) and a new role
    (no place in the allocation `up` planned) are refused before anything changes."""
    d = Deployment(tmp_path / "home", "live-slurm")
    d.home.mkdir()
    monkeypatch.setenv("DECODE_TOKEN", "tok-first-6a1e93c2")
    data = yaml.safe_load(EXAMPLE.read_text())
    data["name"] = d.name
    data["roles"]["decode"]["env"] = {"DECODE_TOKEN": "${env:DECODE_TOKEN}"}
    path = d.home.parent / f"{d.name}.yaml"

    def write(**decode) -> Path:
        edited = {**data, "roles": {**data["roles"], "decode": {**data["roles"]["decode"], **decode}}}
        path.write_text(yaml.safe_dump(edited))
        return path

    result = d.cli("up", write(), "--on", "slurm", "--rehearse", "-d", "--sbatch=--gres=gpu:2", timeout=240)
    if result.returncode != 0:
        cancel_and_kill(d)
        raise AssertionError(f"up: {result.stdout}{result.stderr}\n{tails(d)}")
    try:
        job = job_id(d)
        router_url = d.role("router")["url"]
        before = {r["name"]: r["pid"] for r in d.status()["roles"]}
        with SteadyLoad(router_url, MODEL) as load:
            load.wait_for(4)
            out = d.cli("up", write(mem_fraction=0.7), "--on", "slurm", "--rehearse", timeout=300)
            assert out.returncode == 0, f"{out.stdout}{out.stderr}\n{tails(d)}"
            assert "carries its traffic while it is replaced" in out.stdout, out.stdout
            load.wait_for(4)
        assert load.failures == [] and load.ok >= 8, load.failures
        roles = {r["name"]: r for r in d.status()["roles"]}
        assert sorted(roles) == ["decode", "prefill", "router"] and roles["decode"]["generation"] == 1
        argv = next(r["argv"] for r in d.state_file()["roles"] if r["name"] == "decode")
        assert argv[argv.index("--mem-fraction-static") + 1] == "0.7", argv
        assert roles["prefill"]["pid"] == before["prefill"] and roles["router"]["pid"] == before["router"]
        again = d.cli("up", path, "--on", "slurm", "--rehearse", timeout=120)
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr

        monkeypatch.setenv("DECODE_TOKEN", "tok-second-0b7d55f1")
        refused = d.cli("up", path, "--on", "slurm", "--rehearse", timeout=120)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "${env:DECODE_TOKEN}: not the value live-slurm was started with" in refused.stderr
        assert "tok-second" not in refused.stdout + refused.stderr
        assert not any(
            "tok-second" in p.read_text(errors="replace") for p in d.run_dir.rglob("*") if p.is_file()
        )
        monkeypatch.setenv("DECODE_TOKEN", "tok-first-6a1e93c2")

        data["roles"]["long"] = {"kind": "decode", "host": "10.0.0.2", "gpus": [1], "port": 30003}
        data["roles"]["router"] = {**data["roles"]["router"], "decode": ["decode", "long"]}
        refused = d.cli("up", write(mem_fraction=0.7), "--on", "slurm", "--rehearse", timeout=120)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "the new role instance long: not made while it runs on slurm" in refused.stderr, refused.stderr
        after = {r["name"]: (r["pid"], r["generation"]) for r in d.status()["roles"]}
        assert after == {n: (r["pid"], r["generation"]) for n, r in roles.items()}
        down = d.cli("down", d.name, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert_nothing_left(d, job)
        assert not d.ports_held()
    finally:
        cancel_and_kill(d)
