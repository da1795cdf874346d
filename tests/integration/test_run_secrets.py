"""`${env:...}` values never in clear (issue 9, item 14): not when a secret program fails to execute (the
terminal, state.json, supervisor.log, the role's log), nor in the command line `down` prints of a process
it had to kill."""

from __future__ import annotations

import sys

import psutil
import pytest
from harness import STAND_IN, free_ports

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-t0ken-Xq9"


def everything_written(deployment, *outputs: str) -> str:
    files = [
        deployment.run_dir / "state.json",
        deployment.run_dir / "supervisor.log",
        *(deployment.run_dir / "logs").glob("*"),
    ]
    return "\n".join([*outputs, *(f.read_text(errors="replace") for f in files if f.is_file())])


@pytest.mark.faults(
    "14. a secret program that fails to execute: not in the terminal, state, supervisor.log, logs"
)
@pytest.mark.parametrize("program", ["missing", "unexecutable"])
@pytest.mark.parametrize("detach", [True, False], ids=["detached", "foreground"])
def test_a_secret_program_that_cannot_run_is_never_shown(deployment, tmp_path, monkeypatch, program, detach):
    (port,) = free_ports(1)
    path = tmp_path / f"bin-{SECRET}"
    if program == "unexecutable":  # passes the check before anything starts; exec fails in the supervisor
        path.write_text("#!/nonexistent/interpreter\n")
        path.chmod(0o755)
    monkeypatch.setenv("SECRET_BIN", str(path))
    topology = deployment.write(
        {
            "server": {
                "kind": "command",
                "command": ["${env:SECRET_BIN}", "--port", "{port}"],
                "port": port,
                "ready": {"tcp": True, "timeout": 5},
            },
        }
    )
    up = deployment.cli("up", topology, *(["--detach"] if detach else []))
    assert up.returncode == 1, up.stdout + up.stderr
    assert "***" in up.stdout + up.stderr  # it says which program, redacted
    assert SECRET not in everything_written(deployment, up.stdout, up.stderr)
    status = deployment.cli("status", deployment.name)
    assert SECRET not in status.stdout + status.stderr


@pytest.mark.faults("14. down's description of a killed process: no secret in its command line")
def test_down_describes_a_killed_process_without_its_secret(deployment, monkeypatch):
    (port,) = free_ports(1)
    monkeypatch.setenv("API_KEY", SECRET)
    topology = deployment.write(
        {
            # The secret early in the command line: `down` cuts descriptions at 100 characters.
            "server": {
                "kind": "command",
                "port": port,
                "stop": {"grace": 0.5},
                "command": [
                    sys.executable,
                    STAND_IN,
                    "--api-key",
                    "${env:API_KEY}",
                    "--port",
                    "{port}",
                    "--ignore-sigterm",
                    "--token=${env:API_KEY}",
                ],
                "ready": {"http": "/health", "interval": 0.05},
            },
        }
    )
    up = deployment.cli("up", topology, "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    down = deployment.cli("down", deployment.name)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "had to SIGKILL:" in down.stdout and "--api-key ***" in down.stdout, down.stdout
    assert SECRET not in everything_written(deployment, down.stdout, down.stderr)
    assert deployment.alive() == []


@pytest.mark.faults("6. a damaged state.json under a live supervisor: down finds it by the lock it holds")
def test_down_with_the_state_damaged_under_a_live_supervisor(deployment, monkeypatch):
    """The supervisor's pid was in the state; the lock it holds names it. The secrets' digests went with the
    state, so the process `down` kills is named by its program alone."""
    (port,) = free_ports(1)
    monkeypatch.setenv("API_KEY", SECRET)
    topology = deployment.write(
        {
            "server": {
                "kind": "command",
                "port": port,
                "stop": {"grace": 0.5},
                "command": [
                    sys.executable,
                    STAND_IN,
                    "--api-key",
                    "${env:API_KEY}",
                    "--port",
                    "{port}",
                    "--ignore-sigterm",
                ],
                "ready": {"http": "/health", "interval": 0.05},
            },
        }
    )
    up = deployment.cli("up", topology, "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    supervisor = deployment.state_file()["supervisor_pid"]
    (deployment.run_dir / "state.json").write_text('{"name": "tru')
    down = deployment.cli("down", deployment.name, "--grace", "0.5", timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert (
        f"asked the supervisor holding the deployment's lock (pid {supervisor}) to hand over" in down.stdout
    )
    assert "had to SIGKILL:" in down.stdout and "server: pid " in down.stdout, down.stdout
    assert SECRET not in down.stdout + down.stderr
    assert not psutil.pid_exists(supervisor) or psutil.Process(supervisor).status() == psutil.STATUS_ZOMBIE
    assert deployment.alive() == []
