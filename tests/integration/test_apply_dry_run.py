"""`up FILE --dry-run` against a real running rehearsal (the simulated engine behind the real sglang-router):
the edited file's difference is printed as users see it, and nothing of the running deployment changes;
then `up FILE` applies it under a steady streaming load with no failed request."""

from __future__ import annotations

import pytest
from harness import free_ports, port_open
from steady_load import SteadyLoad

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

        # Applied under a steady streaming load: decode-1 added by the edited file, then decode rolled to
        # the new launch behind it (replica 0 of the file runs on under its running name); no request fails.
        with SteadyLoad(f"http://127.0.0.1:{ports[4]}", "example/tiny-model") as load:
            load.wait_for(4)
            apply = deployment.cli("up", topology, "--rehearse", timeout=300)
            assert apply.returncode == 0, apply.stdout + apply.stderr
            load.wait_for(4)
        assert load.failures == [] and load.ok >= 8, load.failures
        assert apply.stdout.splitlines()[1] == "  + decode-1 (replicas 1 -> 2)"  # the difference, first
        assert apply.stdout.rstrip().endswith(f"{deployment.name}: applied (2 steps)"), apply.stdout
        after = snapshot(deployment)
        assert set(after) == {"prefill", "decode", "decode-1", "router"}
        assert after["prefill"] == before["prefill"] and after["router"] == before["router"]  # not touched
        assert after["decode"][0] != before["decode"][0] and port_open(ports[3])
        for role in deployment.state_file()["roles"]:
            if role["name"].startswith("decode"):
                assert role["argv"][role["argv"].index("--mem-fraction-static") + 1] == "0.75", role["argv"]
        again = deployment.cli("up", topology, "--rehearse", "--dry-run")
        assert "changes nothing of it; nothing to do" in again.stdout, again.stdout
    finally:
        down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
