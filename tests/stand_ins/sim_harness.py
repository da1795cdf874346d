"""Small helpers to start simulated engines and real routers as subprocesses (tests, demos).

Every process is started in its own session and stopped by its own PID (SIGTERM, then
SIGKILL after a grace period) - never by name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A port below the kernel's ephemeral range, free with the next three (harness.free_ports)."""
    from harness import free_ports

    return free_ports(1)[0]


def venv_bin(name: str) -> str:
    """A console script next to the running interpreter (the project venv's routers)."""
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else name


@dataclass
class Proc:
    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen | None = None
    started: float = 0.0

    def start(self) -> Proc:
        env = dict(os.environ)
        env.update(self.env)
        self._log = open(self.log_path, "ab")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 3.0) -> int | None:
        """SIGTERM this PID, wait, then SIGKILL it. Returns the exit status."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            try:
                self.popen.send_signal(signal.SIGTERM)
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)
            except ProcessLookupError:
                pass
        try:
            self._log.close()
        except Exception:
            pass
        return self.popen.returncode


WEATHER_MSG = [
    {"role": "user", "content": "Use get_weather to check the current weather in Beijing in Celsius."}
]


def sim_argv(
    engine: str,
    engine_args: list[str],
    *,
    ready_after: float = 0.2,
    state_dir: str | None = None,
    kv_timeout: float | None = None,
    itl: float | None = None,
    extra: list[str] = (),
) -> list[str]:
    argv = [sys.executable, "-m", "muse_launch.sim", "--engine", engine, "--ready-after", str(ready_after)]
    if state_dir:
        argv += ["--state-dir", str(state_dir)]
    if kv_timeout is not None:
        argv += ["--kv-timeout", str(kv_timeout)]
    if itl is not None:
        argv += ["--itl", str(itl)]
    return argv + list(extra) + ["--"] + list(engine_args)


def http(
    method: str, url: str, body: Any = None, timeout: float = 30.0, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def get_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        return http("GET", url, timeout=timeout)[0]
    except (urllib.error.URLError, OSError, ConnectionError):
        return None


def wait_status(url: str, status: int = 200, timeout: float = 20.0, procs: list[Proc] | None = None) -> float:
    """Poll until GET url answers `status`; returns the seconds waited. Fails early if one
    of `procs` exits."""
    t0 = time.monotonic()
    timeout = max(timeout, 60.0)  # a loaded 2-core machine is slow; a pass returns at once
    while time.monotonic() - t0 < timeout:
        if get_status(url) == status:
            return time.monotonic() - t0
        for p in procs or []:
            if not p.alive():
                raise RuntimeError(
                    f"{p.name} exited ({p.popen.returncode}) while waiting for {url}:\n{p.log()[-3000:]}"
                )
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer {status} within {timeout}s")


def sse_events(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
