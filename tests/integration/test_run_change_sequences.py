"""Live changes as sequences, not one happy step (hypothesis drawing them, against a rehearsal of an 8xB300
host): `scale` of either worker role from any N to any M, rolling restarts, and `up` of an edited file (a
changed flag, more or fewer replicas), in any order. After every step the layout is one a real host accepts:
no GPU and no port held by two instances, each worker on exactly its tp GPUs, the router listing exactly the
serving instances, no change left in progress; a change that is refused (no room: exit 1) changed nothing.
"""

from __future__ import annotations

import httpx
import pytest
import yaml
from harness import free_ports
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

MODEL = "Qwen/Qwen3-0.6B"
TP = {"prefill": 1, "decode": 2}  # prefill on 1 GPU, decode on 2: 8 GPUs fit several mixes, not every one


def topology(name: str, ports: list[int], decode_replicas: int, mem_fraction: float) -> dict:
    prefill, decode, router, boot, metrics = ports
    probe = {"http": "/health", "interval": 0.1, "timeout": 120}
    return {
        "version": 1,
        "name": name,
        "hardware": "b300",
        "engine": "sglang",
        "model": MODEL,
        "rehearse": {"ready_after": 0.2},
        "roles": {
            "prefill": {
                "kind": "prefill",
                "gpus": [0],
                "tp": 1,
                "port": prefill,
                "bootstrap_port": boot,
                "ready": probe,
            },
            "decode": {
                "kind": "decode",
                "gpus": list(range(1, 1 + 2 * decode_replicas)),
                "tp": 2,
                "port": decode,
                "replicas": decode_replicas,
                "mem_fraction": mem_fraction,
                "ready": probe,
            },
            "router": {
                "kind": "router",
                "port": router,
                "metrics_port": metrics,
                "prefill": ["prefill"],
                "decode": ["decode"],
            },
        },
    }


@st.composite
def sequences(draw) -> list[tuple]:
    """Six or seven steps in any order: a scale-up of each worker role among them (a few examples must reach
    the placement that matters), the rest any scale N -> M, restart or edit."""
    steps: list[tuple] = [
        ("scale", "decode", draw(st.integers(min_value=2, max_value=4))),
        ("scale", "prefill", draw(st.integers(min_value=2, max_value=4))),
    ]
    steps += draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.just("scale"), st.sampled_from(sorted(TP)), st.integers(min_value=1, max_value=5)
                ),
                st.tuples(st.just("restart"), st.sampled_from(sorted(TP))),
                st.tuples(
                    st.just("edit"), st.integers(min_value=1, max_value=3), st.sampled_from([0.7, 0.8])
                ),
            ),
            min_size=4,
            max_size=5,
        )
    )
    return draw(st.permutations(steps))


def test_any_sequence_of_changes_keeps_a_layout_a_real_host_accepts(deployment):
    d = deployment
    ports = free_ports(5)
    path = d.home.parent / f"{d.name}.yaml"

    def run(log: list[str], *args: str, allowed: tuple[int, ...] = (0,)) -> int:
        result = d.cli(*args, timeout=300)
        log.append(f"{' '.join(args[:4])} -> {result.returncode}")
        assert result.returncode in allowed, f"{log}: {result.stdout}{result.stderr}"
        assert "Traceback" not in result.stderr and "Error:" not in result.stderr, result.stderr
        return result.returncode

    def counts() -> dict[str, int]:
        roles = d.state_file()["roles"]
        return {role: sum(1 for r in roles if r["kind"] == role) for role in TP}

    def sound(log: list[str]) -> None:
        status = d.status()
        roles = {r["name"]: r for r in status["roles"]}
        gpus = [g for r in roles.values() for g in r["gpus"]]
        assert len(gpus) == len(set(gpus)), (log, {n: r["gpus"] for n, r in roles.items()})
        assert all(0 <= g < 8 for g in gpus), log
        held = [p for r in roles.values() for p in r["ports"].values()]
        assert len(held) == len(set(held)), (log, {n: r["ports"] for n, r in roles.items()})
        for name, role in roles.items():
            if role["kind"] in TP:
                assert len(role["gpus"]) == TP[role["kind"]], (log, name, role["gpus"])
                assert role["state"] == "ready", (log, name, role["state"])
        answer = httpx.get(f"http://127.0.0.1:{ports[2]}/workers", timeout=5).json()
        listed = sorted(w["url"] for w in answer["workers"])
        assert listed == sorted(r["url"] for r in roles.values() if r["kind"] in TP), log
        assert status["change"] is None, log

    @given(steps=sequences())
    @settings(
        max_examples=2,
        deadline=None,
        database=None,
        phases=(Phase.generate,),  # a new mix each run; a failure prints its steps (no shrinking: minutes)
        suppress_health_check=list(HealthCheck),
    )
    def changes_hold(steps: list[tuple]) -> None:
        log: list[str] = []
        path.write_text(yaml.safe_dump(topology(d.name, ports, 1, 0.8)))
        run(log, "up", str(path), "--rehearse", "-d")
        try:
            for step in steps:
                before = counts()
                if step[0] == "scale":
                    _, role, replicas = step
                    code = run(log, "scale", d.name, role, str(replicas), allowed=(0, 1))
                    after = counts()
                    assert after[role] == replicas if code == 0 else after == before, (log, before, after)
                elif step[0] == "restart":
                    run(log, "restart", d.name, step[1], allowed=(0, 1))  # alone on a full host: refused
                    assert counts() == before, log
                else:
                    _, replicas, mem_fraction = step
                    path.write_text(yaml.safe_dump(topology(d.name, ports, replicas, mem_fraction)))
                    run(log, "up", str(path), "--rehearse", allowed=(0, 1))
                sound(log)
        finally:
            run(log, "down", d.name)
        assert d.alive() == [], log

    changes_hold()
