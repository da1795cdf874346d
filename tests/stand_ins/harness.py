"""Helpers for the runtime's integration tests: topology files of stand-ins, the CLI in a
subprocess, and a scan for every process a deployment left alive."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

STAND_IN = str(Path(__file__).with_name("server.py"))
ROUTER = str(Path(sys.executable).with_name("sglang-router"))
REPO = Path(__file__).resolve().parents[2]


BLOCK = 4  # a role's replicas and side ports take its port + 1, + 2...: each port is free with the next three


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int) -> list[int]:
    """n ports, each free with the next BLOCK - 1, no two blocks overlapping, below the kernel's ephemeral
    range: no client's connection (a steady load through the router, a probe) takes one as its own port
    between the choice and the role's bind, however loaded the machine. Each pytest-xdist worker has a
    network namespace of its own (scripts/netns_python), so workers never meet."""
    top = min(_ephemeral_start(), 32768) - BLOCK
    chosen: list[int] = []
    while len(chosen) < n:
        port = random.randrange(10000, top)
        if any(abs(port - c) < BLOCK for c in chosen):
            continue
        try:
            held = [socket.create_server(("127.0.0.1", p)) for p in range(port, port + BLOCK)]
        except OSError:
            continue
        for s in held:
            s.close()
        chosen.append(port)
    return chosen


def stand_in(port: int, *flags: Any, ready_timeout: float = 20.0, **role: Any) -> dict[str, Any]:
    """A `kind: command` role running the stand-in server, probed on /health every 50 ms."""
    return {
        "kind": "command",
        "command": [sys.executable, STAND_IN, "--port", "{port}", *map(str, flags)],
        "port": port,
        "ready": {"http": "/health", "interval": 0.05, "timeout": ready_timeout},
        **role,
    }


@dataclass
class Deployment:
    """One deployment name under its own MUSE_LAUNCH_HOME, driven through the real CLI."""

    home: Path
    name: str
    sessions: set[int] = field(default_factory=set)  # role pids seen in `status`: each leads a session
    ports: set[int] = field(default_factory=set)  # every role port of the files it wrote

    @property
    def run_dir(self) -> Path:
        return self.home / self.name

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "MUSE_LAUNCH_HOME": str(self.home), "HF_HUB_OFFLINE": "1"}

    def write(self, roles: dict[str, dict[str, Any]], **top: Any) -> Path:
        path = self.home.parent / f"{self.name}.yaml"
        self.ports.update(r["port"] for r in roles.values() if isinstance(r.get("port"), int))
        path.write_text(
            yaml.safe_dump({"version": 1, "name": self.name, "hardware": "cpu", **top, "roles": roles})
        )
        return path

    def cli(self, *args: Any, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "muse_launch", *map(str, args)],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, *args: Any) -> subprocess.Popen:
        """A foreground `up`, left running."""
        return subprocess.Popen(
            [sys.executable, "-m", "muse_launch", *map(str, args)],
            env=self.env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def status(self) -> dict[str, Any]:
        result = self.cli("status", self.name, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        status = json.loads(result.stdout)
        self.sessions.update(r["pid"] for r in status["roles"] if r["pid"])
        return status

    def state_file(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "state.json").read_text())

    def role(self, name: str) -> dict[str, Any]:
        return next(r for r in self.status()["roles"] if r["name"] == name)

    def alive(self) -> list[psutil.Process]:
        """Every live process carrying this deployment's marker, in the session of a role seen in `status`
        (a process that rewrote its title has a blank environ), or in one of its role cgroups (one that also
        left the session and cleared its environment). Zombies hold nothing."""
        from muse_launch.proc import cgroups

        contained = {
            pid
            for path in cgroups.role_cgroups(self.name, str(self.run_dir))
            for pid in cgroups.members(path)
        }
        found = []
        for proc in psutil.process_iter():
            try:
                env = proc.environ()
                marked = env.get("MUSE_LAUNCH_DEPLOYMENT") == self.name and env.get(
                    "MUSE_LAUNCH_RUN_DIR"
                ) == str(self.run_dir)
                ours = marked or os.getsid(proc.pid) in self.sessions or proc.pid in contained
                if ours and proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def ports_held(self) -> list[int]:
        """The file's role ports some process other than this test still listens on."""
        held = set()
        for conn in psutil.net_connections("inet"):
            if (
                conn.status == psutil.CONN_LISTEN
                and conn.laddr.port in self.ports
                and conn.pid != os.getpid()
            ):
                held.add(conn.laddr.port)
        return sorted(held)

    def kill_leftovers(self) -> None:
        for proc in self.alive():
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        state = self.run_dir / "state.json"
        try:
            pid = json.loads(state.read_text()).get("supervisor_pid")
        except (OSError, ValueError, AttributeError, RecursionError):  # none, or damaged on purpose
            pid = None
        if pid:
            try:
                psutil.Process(pid).send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        from muse_launch.proc import cgroups

        for path in cgroups.role_cgroups(
            self.name, str(self.run_dir)
        ):  # what a failed test left: kill, remove
            cgroups.kill(path)
            cgroups.remove(path)


def described(proc: psutil.Process) -> str:
    """pid, status, parent and command line of a process, read now (a later repr shows what it became)."""
    try:
        with proc.oneshot():
            return f"pid {proc.pid} ({proc.status()}, parent {proc.ppid()}): {' '.join(proc.cmdline())[:300]}"
    except psutil.Error as exc:
        return f"pid {proc.pid} ({type(exc).__name__} while reading it)"


# The shortest deadline any wait gets: on a loaded 2-core machine (CI shares one with other jobs) a CLI call
# takes seconds and a restart cycle tens of them. A condition that comes true returns at once; only a
# failure waits this long.
LOADED_FLOOR = 60.0


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """The condition's first true value, polled every `interval`; fails after max(timeout, LOADED_FLOOR) s."""
    timeout = max(timeout, LOADED_FLOOR)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {condition}")


def writing_to_a_full_pipe(pid: int) -> bool:
    """Whether a thread of process `pid` is blocked writing to a pipe that nobody reads (its wchan): the
    event a test of a slow reader waits for, where a fixed sleep would be too short on a loaded machine."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if "pipe_write" in (task / "wchan").read_text():
                return True
        except OSError:
            continue
    return False


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def deployment(tmp_path: Path, request: pytest.FixtureRequest) -> Deployment:
    """A fresh home and name; whatever the test leaves alive is killed afterwards (and fails the test)."""
    home = tmp_path / "home"
    home.mkdir()
    d = Deployment(home, request.node.name.replace("_", "-").lower()[:40].strip("-"))
    yield d
    leftovers = [described(p) for p in d.alive()]  # as found: the kill below turns them into zombies
    ports = d.ports_held()
    request.node.user_properties.append(("left", (len(leftovers), len(ports))))
    d.kill_leftovers()
    assert not leftovers, f"processes left alive: {leftovers}"
    assert not ports, f"ports left held: {ports}"
