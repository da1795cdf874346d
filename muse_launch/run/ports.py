"""Ports on this host: is a planned port free before `up`, who holds it, is it closed after `down`."""

from __future__ import annotations

import socket
from dataclasses import dataclass

import psutil

from muse_launch.plan.spec import Plan


@dataclass(frozen=True)
class BusyPort:
    role: str
    name: str  # http, bootstrap, encoder_bootstrap, metrics, ...
    port: int
    holder: str

    def __str__(self) -> str:
        return f"roles.{self.role} {self.name} port {self.port} is in use by {self.holder}"


def can_bind(bind: str, port: int) -> bool:
    """Bind as a server would (SO_REUSEADDR, so a TIME_WAIT left by an earlier run is no obstacle)."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    for conn in psutil.net_connections(kind="inet"):
        if conn.laddr and conn.laddr.port == port and conn.status in (psutil.CONN_LISTEN, psutil.CONN_NONE):
            if conn.pid is None:
                return "a process this user cannot see"
            try:
                proc = psutil.Process(conn.pid)
                return f"pid {conn.pid} ({' '.join(proc.cmdline()).strip()[:100] or proc.name()})"
            except psutil.Error:
                return f"pid {conn.pid}"
    return "an unknown process"


def busy_ports(plan: Plan) -> list[BusyPort]:
    return [
        BusyPort(spec.name, name, port, port_holder(port))
        for spec in plan.specs
        for name, port in spec.ports.items()
        if not can_bind(spec.bind, port)
    ]


def is_listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True
