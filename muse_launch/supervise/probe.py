"""Readiness probes. A refused connection or a 503 means "not yet", never "failed": whether a
starting role has failed is decided by its process exiting or by the probe's timeout."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import httpx

from muse_launch.backend_types import OwnerOf, nobody
from muse_launch.plan.spec import Probe, ProbeKind
from muse_launch.proc.identity import is_suspended
from muse_launch.proc.listeners import ListenerOwner
from muse_launch.rundir.logfiles import LineSplitter, read_chunk
from muse_launch.rundir.state import DeploymentRecord, RunDir

HTTP_TIMEOUT = 2.0  # a probe's time budget: an answer slower than this counts as "not ready yet"


NO_ANSWER_YET = "no answer yet"


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ReadinessCheck:
    """One role's probe, polled repeatedly; `last_seen` says what the latest attempt observed."""

    def __init__(
        self,
        probe: Probe,
        host: str,
        port: int | None,
        log_path: Path,
        client: httpx.Client,
        owner: ListenerOwner | None = None,
    ):
        """`owner`: for a role on this host, whose listener must be the one that answers (none on SLURM)."""
        self.probe = probe
        self.host = host
        self.port = port
        self.log_path = log_path
        self.client = client
        self.owner = owner
        self.last_seen = NO_ANSWER_YET
        self._log_offset = 0
        self._log_lines = LineSplitter()

    def check(self, alive_for: float) -> bool:
        if self.probe.kind is ProbeKind.HTTP:
            return self._check_http()
        if self.probe.kind is ProbeKind.TCP:
            return self._check_tcp()
        if self.probe.kind is ProbeKind.LOG:
            return self._check_log()
        self.last_seen = f"alive for {alive_for:.1f}s"
        return alive_for >= self.probe.interval  # a process without an endpoint: alive for a moment

    def _check_http(self) -> bool:
        for path in self.probe.paths:
            try:
                answer = self.client.get(base_url(self.host, self.port) + path, timeout=HTTP_TIMEOUT)
            except httpx.ConnectError:
                self.last_seen = f"GET {path}: connection refused"
                return False
            except httpx.TimeoutException:
                self.last_seen = f"GET {path}: no answer within {HTTP_TIMEOUT:g}s"
                return False
            except httpx.TransportError as e:
                self.last_seen = f"GET {path}: {type(e).__name__}"
                return False
            if answer.status_code != self.probe.status:
                self.last_seen = f"GET {path} answered {answer.status_code}"
                return False
        return self._owned()

    def _owned(self) -> bool:
        """The port answered: ready if the role holds the listener (checked once per role process)."""
        if self.owner is not None and (someone_else := self.owner.check(self.port, self.host)):
            self.last_seen = someone_else
            return False
        self.last_seen = "ready"
        return True

    def _check_tcp(self) -> bool:
        try:
            socket.create_connection((self.host, self.port), timeout=HTTP_TIMEOUT).close()
        except OSError as e:
            self.last_seen = f"TCP {self.port}: {e.strerror or type(e).__name__}"
            return False
        return self._owned()

    def _check_log(self) -> bool:
        """Matches the pattern against complete lines written since the last check, a chunk at a time
        (a role that logs gigabytes while starting costs no memory); a rotated log is read from its start."""
        pattern = re.compile(self.probe.pattern or "")
        # what was there at the first look: a role writing faster than this reads cannot keep it here
        end = None
        while end is None or self._log_offset < end:
            chunk, size = read_chunk(self.log_path, self._log_offset)
            end = size if end is None else end
            if size < self._log_offset:
                self._log_offset, end = 0, size
                self._log_lines.reset()
                continue
            if not chunk:
                break
            self._log_offset += len(chunk)
            if any(pattern.search(line.decode(errors="replace")) for line in self._log_lines.feed(chunk)):
                self.last_seen = "ready"
                return True
        self.last_seen = f"no log line matches {self.probe.pattern!r} yet"
        return False


def health_now(
    record: DeploymentRecord, run_dir: RunDir, client: httpx.Client, owner_of: OwnerOf = nobody
) -> dict[str, str | None]:
    """ "ok", or what the role's probe sees now; None for a role without a live process."""
    out: dict[str, str | None] = {}
    for role in record.roles:
        if role.process is None or not role.live:
            out[role.name] = None
            continue
        if role.process.find() and is_suspended(role.process.pid):  # its probe would only time out
            out[role.name] = "stopped (SIGSTOP)"
            continue
        check = ReadinessCheck(
            role.probe,
            role.probe_host,
            role.ports.get("http"),
            run_dir.log(role.name),
            client,
            owner_of(role),
        )
        out[role.name] = "ok" if check.check(alive_for=float("inf")) else check.last_seen
    return out
