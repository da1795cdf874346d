"""Readiness probes. A refused connection or a 503 means "not yet", never "failed": whether a
starting role has failed is decided by its process exiting or by the probe's timeout."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import httpx

from muse_launch.plan.spec import Probe, ProbeKind
from muse_launch.run.logs import open_log

HTTP_TIMEOUT = 2.0  # a probe's time budget: an answer slower than this counts as "not ready yet"


NO_ANSWER_YET = "no answer yet"


def base_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ReadinessCheck:
    """One role's probe, polled repeatedly; `last_seen` says what the latest attempt observed."""

    def __init__(self, probe: Probe, host: str, port: int | None, log_path: Path, client: httpx.Client):
        self.probe = probe
        self.host = host
        self.port = port
        self.log_path = log_path
        self.client = client
        self.last_seen = NO_ANSWER_YET
        self._log_offset = 0
        self._log_partial = b""

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
        self.last_seen = "ready"
        return True

    def _check_tcp(self) -> bool:
        try:
            socket.create_connection((self.host, self.port), timeout=HTTP_TIMEOUT).close()
        except OSError as e:
            self.last_seen = f"TCP {self.port}: {e.strerror or type(e).__name__}"
            return False
        self.last_seen = "ready"
        return True

    def _check_log(self) -> bool:
        """Matches the pattern against complete lines written since the last check."""
        try:
            with open_log(self.log_path) as log:  # no planted link followed
                log.seek(self._log_offset)
                chunk = log.read()
        except OSError:
            chunk = b""
        self._log_offset += len(chunk)
        *lines, self._log_partial = (self._log_partial + chunk).split(b"\n")
        pattern = re.compile(self.probe.pattern or "")
        if any(pattern.search(line.decode(errors="replace")) for line in lines):
            self.last_seen = "ready"
            return True
        self.last_seen = f"no log line matches {self.probe.pattern!r} yet"
        return False
