"""`up FILE --dry-run` against a real running rehearsal (the simulated engine behind the real sglang-router):
the edited file's difference is printed as users see it, and nothing of the running deployment changes."""

from __future__ import annotations

import pytest
from harness import free_ports, port_open

pytestmark = [pytest.mark.rehearsal, pytest.mark.integration]


def pd(d, ports: list[int], mem_fraction: float = 0.8, replicas: int = 1):
    prefill, boot, decode, decode_1, router, metrics = ports
    probe = {"http": "/health", "interval": 0.05, "timeout": 60}
    return d.write(
        {
            "prefill": {
                "kind": "prefill",
                "gpus": [0],
                "port": prefill,
                "bootstrap_port": boot,
                "mem_fraction": 0.8,
                "ready": probe,
            },
            "decode": {
                "kind": "decode",
                "gpus": [1, 2][:replicas],
                "replicas": replicas,
                "port": [decode, decode_1][:replicas] if replicas > 1 else decode,
                "bootstrap_port": boot,
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
        hardware="b300",
        engine="sglang",
        model="example/tiny-model",
        rehearse={"ready_after": 0.3},
    )


def snapshot(d) -> dict[str, tuple]:
    """Each role's process, start and state, as `status` shows them."""
    return {r["name"]: (r["pid"], r["state"], r["ready_at"], r["restarts"]) for r in d.status()["roles"]}


def test_dry_run_prints_the_edited_files_difference_and_changes_nothing(deployment):
    ports = free_ports(6)
    topology = pd(deployment, ports)
    up = deployment.cli("up", topology, "--rehearse", "--detach", timeout=180)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        before = snapshot(deployment)
        assert set(before) == {"prefill", "decode", "router"}
        state = deployment.state_file()

        same = deployment.cli("up", topology, "--rehearse", "--dry-run")
        assert same.returncode == 0, same.stdout + same.stderr
        assert same.stdout.strip() == (
            f"{deployment.name}: running, and {topology} changes nothing of it; nothing to do"
        )

        pd(deployment, ports, mem_fraction=0.75, replicas=2)  # the file edited in place
        dry = deployment.cli("up", topology, "--rehearse", "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert dry.stdout.splitlines() == [
            f"{deployment.name}: running; {topology} changes it (2 steps):",
            "  + decode-1 (replicas 1 -> 2)",
            "  ~ decode: args --mem-fraction-static 0.8 -> 0.75 (rolled, one instance at a time)",
            "  unchanged, not touched: prefill, router",
            "plan:",
            "  1. start decode-1 (decode), wait until it is ready, then register it with its router",
            "  2. restart decode with its new launch, wait until it is ready and wired",
            "--dry-run: nothing was changed; the same `up` without --dry-run applies it",
        ]

        assert snapshot(deployment) == before  # the same processes, none restarted
        assert deployment.state_file()["roles"] == state["roles"]
        assert not port_open(ports[3])  # no decode-1 was started
        assert deployment.status()["state"] == "ready"

        # Applied, a new launch of decode is refused before any step: this host restarts the launch it runs.
        apply = deployment.cli("up", topology, "--rehearse")
        assert apply.returncode == 1, apply.stdout + apply.stderr
        assert "Traceback" not in apply.stdout + apply.stderr
        assert (
            apply.stdout.splitlines()[1] == "  + decode-1 (replicas 1 -> 2)"
        )  # the difference, printed first
        assert (
            f"error: {deployment.name}: a new launch of decode: not made while it runs on local yet"
        ) in apply.stderr
        assert "nothing was changed" in apply.stderr and "  fix: `muse-launch down" in apply.stderr
        assert snapshot(deployment) == before and not port_open(ports[3])
    finally:
        down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
