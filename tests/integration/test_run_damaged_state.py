"""A state.json damaged under a running deployment (issue 18, items 4 and 7): read back as untrusted input, it
is "damaged" however it is wrong (a field of the wrong type, a signal `down` may not send, a stop wave naming
no role, a cgroup not the role's, 100,000 nested brackets), and `down` still stops everything by the
deployment's marker and cgroups, while `status`, `ls` and `logs` say it is damaged (exit 1, never 70)."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
from harness import free_ports, port_open, stand_in, wait_for

pytestmark = pytest.mark.integration


def wrong_ticks(state: dict) -> None:
    state["roles"][0]["start_ticks"] = "x"


def unknown_signal(state: dict) -> None:
    state["roles"][0]["stop"]["signal"] = "SIGNOPE"


def wave_of_no_role(state: dict) -> None:
    state["stop_waves"].insert(0, ["ghost"])


def foreign_cgroup(state: dict) -> None:
    state["roles"][0]["cgroup"] = "/sys/fs/cgroup/system.slice"  # `down` would kill all of it


def wrong_time(state: dict) -> None:
    state["roles"][0]["ready_at"] = 1700000000


def wrong_url(state: dict) -> None:
    state["roles"][0]["url"] = {"host": "x"}


DAMAGE = {
    'start_ticks: "x"': wrong_ticks,
    "unknown stop signal": unknown_signal,
    "stop wave naming no role": wave_of_no_role,
    "a cgroup not the role's": foreign_cgroup,
    "ready_at a number": wrong_time,
    "url an object": wrong_url,
}


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.faults(
    "18.4 a damaged state.json: down stops everything by marker and cgroup; status/ls/logs say so"
)
@pytest.mark.parametrize("damage", [*DAMAGE, "100,000 nested brackets"])
@pytest.mark.parametrize("supervisor", ["alive", "dead"])
def test_down_stops_a_deployment_whose_state_is_damaged(deployment, damage, supervisor):
    (port,) = free_ports(1)
    up = deployment.cli("up", deployment.write({"server": stand_in(port, stop={"grace": 2})}), "--detach")
    assert up.returncode == 0, up.stdout + up.stderr
    state = deployment.state_file()
    role_pid, supervisor_pid = state["roles"][0]["pid"], state["supervisor_pid"]
    if supervisor == "dead":
        os.kill(supervisor_pid, signal.SIGKILL)
        wait_for(lambda: gone(supervisor_pid))
    if damage in DAMAGE:
        DAMAGE[damage](state)
        text = json.dumps(state)
    else:
        text = "[" * 100_000 + "]" * 100_000
    (deployment.run_dir / "state.json").write_text(text)

    for command in (("status", deployment.name), ("ls",), ("logs", deployment.name)):
        seen = deployment.cli(*command)
        assert seen.returncode in (0, 1), f"{command}: {seen.returncode}\n{seen.stdout}{seen.stderr}"
        assert "Traceback" not in seen.stderr
        assert "state.json is damaged" in seen.stderr, f"{command}: {seen.stdout}{seen.stderr}"
        if command[0] != "ls":
            assert seen.returncode == 1 and "fix: `muse-launch down" in seen.stderr, seen.stderr

    down = deployment.cli("down", deployment.name, "--grace", "2", timeout=60)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "state.json is missing or damaged: stopped the processes in the deployment's marker" in down.stdout
    assert "server" in down.stdout
    assert gone(role_pid) and gone(supervisor_pid)
    wait_for(lambda: not port_open(port), timeout=10)
    assert deployment.alive() == []
