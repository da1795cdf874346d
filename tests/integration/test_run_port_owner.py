"""Two deployments given one port (issue 9, item 13): the loser's process survives its failed bind, and
its probe reaches the winner's listener. A probe counts only the role's own listener."""

from __future__ import annotations

import subprocess
import sys

import pytest
from harness import REPO, Deployment, free_ports, stand_in, wait_for

pytestmark = pytest.mark.integration


@pytest.mark.faults("13. two deployments on one port: the loser is not ready, its up names the holder")
@pytest.mark.parametrize("probe", [{"tcp": True}, {"http": "/health"}], ids=["tcp", "http"])
def test_a_probe_answered_by_another_deployments_listener_is_not_ready(deployment, tmp_path, probe):
    (port,) = free_ports(1)
    go = tmp_path / "bind-now"
    # The loser: its server binds only once `go` exists (after the winner holds the port), fails, lives on.
    loser = deployment.write(
        {
            "prefill": stand_in(
                port,
                "--bind-when",
                go,
                "--survive-bind-failure",
                ready_timeout=10,
                ready={**probe, "interval": 0.05, "timeout": 10},
            )
        }
    )
    winner = Deployment(deployment.home, deployment.name + "-winner", ports={port})
    winner_file = winner.write({"server": stand_in(port, ready={**probe, "interval": 0.05, "timeout": 20})})
    up = subprocess.Popen(
        [sys.executable, "-m", "muse_launch", "up", loser, "--detach"],
        cwd=REPO,
        env=deployment.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(
            lambda: (deployment.run_dir / "state.json").exists() and deployment.role("prefill")["pid"],
            timeout=20,
        )
        won = winner.cli("up", winner_file, "--detach")
        assert won.returncode == 0, won.stdout + won.stderr
        winner_pid = winner.role("server")["pid"]
        go.touch()
        out, _ = up.communicate(timeout=120)
        assert up.returncode == 1, out
        assert f"port {port} answers, but the listener is pid {winner_pid} (" in out, out
        assert "not role prefill" in out, out
        assert deployment.status()["state"] == "stopped"
        server = winner.role("server")
        assert (
            server["state"] == "ready" and server["health"] == "ok"
        )  # the winner is untouched, its listener its own
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
        winner.cli("down", winner.name)
        winner.kill_leftovers()
    assert winner.alive() == [] and winner.ports_held() == []
