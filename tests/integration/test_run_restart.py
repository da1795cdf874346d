"""After ready: a role that dies is restarted under its policy on the same port, or stops all."""

from __future__ import annotations

import re

import httpx
import pytest
from harness import free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration


def test_a_role_crashing_after_ready_is_restarted_on_the_same_port(deployment, tmp_path):
    base, port = free_ports(2)
    crashed_once = tmp_path / "crashed"
    topology = deployment.write(
        {
            "base": stand_in(base),
            # Ready 6 s after each start: "restarting" lasts the 1 s backoff and those 6 s, long enough for a
            # `status` (a CLI call: seconds on a loaded machine) to see it.
            "flaky": stand_in(
                port,
                "--ready-after",
                6.0,
                "--crash-after-ready",
                1.0,
                "--crash-once",
                crashed_once,
                after=["base"],
                restart={"policy": "on-failure", "max": 2},
            ),
        }
    )
    up = deployment.cli("up", topology, "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    # From up's own lines, not a `status` call that could come after the crash 1 s past ready.
    first_pid = int(re.search(r"flaky\s+starting\s+pid (\d+)", up.stdout)[1])

    # Between the crash and the restart (a 1 s backoff): the role restarting, the deployment degraded.
    status = wait_for(
        lambda: (s := deployment.status())["roles"][1]["state"] == "restarting" and s,
        timeout=10,
        interval=0.1,
    )
    assert status["state"] == "degraded"

    flaky = wait_for(lambda: (r := deployment.role("flaky"))["state"] == "ready" and r, timeout=15)
    assert flaky["restarts"] == 1 and flaky["pid"] != first_pid
    assert flaky["ports"] == {"http": port} and flaky["health"] == "ok"
    assert deployment.status()["state"] == "ready"
    assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
    log = (deployment.run_dir / "logs" / "flaky.log").read_text()
    assert (
        "crashing after ready" in log
        and "--- muse-launch: restart 1 of 2 after: exited with code 1 ---" in log
    )

    assert deployment.cli("down", deployment.name).returncode == 0
    assert deployment.alive() == []


def test_restart_policy_no_leaves_the_deployment_degraded(deployment, tmp_path):
    base, port = free_ports(2)
    topology = deployment.write(
        {
            "base": stand_in(base),
            "fragile": stand_in(port, "--crash-after-ready", 0.3, restart={"policy": "no"}),
        }
    )
    assert deployment.cli("up", topology, "--detach").returncode == 0
    fragile = wait_for(lambda: (r := deployment.role("fragile"))["state"] == "failed" and r, timeout=10)
    assert fragile["pid"] is None and fragile["restarts"] == 0
    status = deployment.status()
    assert status["state"] == "degraded" and status["supervisor_pid"]
    assert deployment.cli("down", deployment.name).returncode == 0
    assert deployment.alive() == []


def test_fail_fast_stops_everything_when_a_role_dies(deployment):
    base, port = free_ports(2)
    topology = deployment.write(
        {"base": stand_in(base), "fragile": stand_in(port, "--crash-after-ready", 0.5)}
    )
    assert deployment.cli("up", topology, "--detach", "--fail-fast").returncode == 0
    status = wait_for(lambda: (s := deployment.status())["supervisor_pid"] is None and s, timeout=10)
    assert status["state"] == "stopped"
    assert {r["name"]: r["state"] for r in status["roles"]} == {"base": "stopped", "fragile": "failed"}
    supervisor_log = (deployment.run_dir / "supervisor.log").read_text()
    assert "role fragile failed: exited with code 1 after it was ready" in supervisor_log
    assert deployment.alive() == []
    assert not port_open(base)


@pytest.mark.faults(
    "also: the restart count resets after a period of health (a crash loop, then healthy, then a crash)"
)
def test_the_restart_count_resets_after_a_period_of_health(deployment, tmp_path):
    (port,) = free_ports(1)
    tokens = tmp_path / "crash-tokens"
    tokens.mkdir()
    topology = deployment.write(
        {
            "flaky": stand_in(
                port,
                "--crash-tokens",
                tokens,
                restart={"policy": "on-failure", "max": 2, "reset_after": 10.0},
            ),
        }
    )
    assert deployment.cli("up", topology, "--detach").returncode == 0
    for n in range(2):
        (tokens / f"crash-{n}").touch()  # two crashes in a row: both restarts of `max: 2` used up
    # Ready for 10 s before the count resets: a window `status` polls (seconds a call) cannot miss.
    flaky = wait_for(
        lambda: (r := deployment.role("flaky"))["restarts"] == 2 and r["state"] == "ready" and r,
        timeout=20,
        interval=0.1,
    )
    assert flaky["restarts_reset_after"] == 10.0
    table = deployment.cli("status", deployment.name).stdout
    assert "2 (reset after 10s ready)" in table, table
    # Ready for 10 s: its count starts again, and the next crash is restarted, not the end of it.
    wait_for(lambda: deployment.role("flaky")["restarts"] == 0, timeout=10, interval=0.1)
    (tokens / "crash-late").touch()
    flaky = wait_for(
        lambda: (r := deployment.role("flaky"))["restarts"] == 1 and r["state"] == "ready" and r,
        timeout=15,
        interval=0.1,
    )
    assert flaky["health"] == "ok"
    assert "restart count reset after 10s ready" in (deployment.run_dir / "supervisor.log").read_text()
    assert deployment.cli("down", deployment.name).returncode == 0
    assert deployment.alive() == []
