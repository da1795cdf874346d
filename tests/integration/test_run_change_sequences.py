"""Live changes as sequences, not one happy step (hypothesis' state machine against a rehearsal of an 8xB300
host): `scale` of either worker role from any N to any M, rolling restarts, and `up` of an edited file (a
changed flag, more or fewer replicas), in any order. After every step the layout is one a real host accepts:
no GPU and no port held by two instances, each worker on exactly its tp GPUs, the router listing exactly the
serving instances, no change left in progress; a change that is refused (no room: exit 1) changed nothing.
"""

from __future__ import annotations

import time

import httpx
import pytest
import yaml
from harness import free_ports
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

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


def test_any_sequence_of_changes_keeps_a_layout_a_real_host_accepts(deployment):
    d = deployment
    ports = free_ports(5)
    path = d.home.parent / f"{d.name}.yaml"

    class Changes(RuleBasedStateMachine):
        def run(self, *args: str, allowed: tuple[int, ...] = (0,)) -> int:
            result = d.cli(*args, timeout=300)
            assert result.returncode in allowed, f"{args}: {result.stdout}{result.stderr}"
            assert "Traceback" not in result.stderr and "Error:" not in result.stderr, result.stderr
            self.log.append(f"{' '.join(args[:4])} -> {result.returncode} at {time.monotonic():.0f}")
            return result.returncode

        def counts(self) -> dict[str, int]:
            roles = d.state_file()["roles"]
            return {role: sum(1 for r in roles if r["kind"] == role) for role in TP}

        @initialize()
        def up(self) -> None:
            self.log: list[str] = []
            path.write_text(yaml.safe_dump(topology(d.name, ports, 1, 0.8)))
            self.run("up", str(path), "--rehearse", "-d")

        @rule(role=st.sampled_from(sorted(TP)), replicas=st.integers(min_value=1, max_value=5))
        def scale(self, role: str, replicas: int) -> None:
            before = self.counts()
            code = self.run("scale", d.name, role, str(replicas), allowed=(0, 1))
            after = self.counts()
            if code == 0:
                assert after[role] == replicas, (self.log, after)
            else:  # refused: no room; nothing started, nothing stopped
                assert after == before, (self.log, before, after)

        @rule(role=st.sampled_from(sorted(TP)))
        def restart(self, role: str) -> None:
            before = self.counts()
            self.run("restart", d.name, role, allowed=(0, 1))  # alone on a full host: refused
            assert self.counts() == before, self.log

        @rule(replicas=st.integers(min_value=1, max_value=3), mem_fraction=st.sampled_from([0.7, 0.8]))
        def edit(self, replicas: int, mem_fraction: float) -> None:
            path.write_text(yaml.safe_dump(topology(d.name, ports, replicas, mem_fraction)))
            self.run("up", str(path), "--rehearse", allowed=(0, 1))

        @invariant()
        def sound(self) -> None:
            if not hasattr(self, "log"):
                return
            status = d.status()
            roles = {r["name"]: r for r in status["roles"]}
            gpus = [g for r in roles.values() for g in r["gpus"]]
            assert len(gpus) == len(set(gpus)), (self.log, {n: r["gpus"] for n, r in roles.items()})
            assert all(0 <= g < 8 for g in gpus), self.log
            ports_held = [p for r in roles.values() for p in r["ports"].values()]
            assert len(ports_held) == len(set(ports_held)), (
                self.log,
                {n: r["ports"] for n, r in roles.items()},
            )
            for name, role in roles.items():
                if role["kind"] in TP:
                    assert len(role["gpus"]) == TP[role["kind"]], (self.log, name, role["gpus"])
                    assert role["state"] == "ready", (self.log, name, role["state"])
            answer = httpx.get(f"http://127.0.0.1:{ports[2]}/workers", timeout=5).json()
            listed = sorted(w["url"] for w in answer["workers"])
            serving = sorted(r["url"] for r in roles.values() if r["kind"] in TP)
            assert listed == serving, self.log
            assert status["change"] is None, self.log

        def teardown(self) -> None:
            if hasattr(self, "log"):
                self.run("down", d.name)
                assert d.alive() == [], self.log

    run_state_machine_as_test(
        Changes,
        settings=settings(
            max_examples=3,
            stateful_step_count=6,
            deadline=None,
            database=None,
            phases=(
                Phase.generate,
            ),  # a new mix each run; a failure prints its steps (no shrinking: minutes)
            suppress_health_check=list(HealthCheck),
        ),
    )
