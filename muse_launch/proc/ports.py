"""Ports on this host: is a planned port free before `up`, who holds it, is it closed after `down`.

A port is always an address and a port: a rehearsal of a multi-node topology puts each node on
its own loopback address (127.0.0.1, 127.0.0.2, ...), so two roles may plan the same port number.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import psutil

from muse_launch.addresses import WILDCARDS
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.proc.masks import command_line
from muse_launch.proc.process import MARKER_DEPLOYMENT, MARKER_ROLE

DEFAULT_ADDRESSES = ("127.0.0.1", *WILDCARDS)  # not worth printing: the single-host case


@dataclass(frozen=True)
class BusyPort:
    role: str
    name: str  # http, bootstrap, encoder_bootstrap, metrics, ...
    port: int
    holder: str
    host: str = "127.0.0.1"  # the address the role binds it on

    def __str__(self) -> str:
        where = "" if self.host in DEFAULT_ADDRESSES else f" on {self.host}"
        return f"roles.{self.role} {self.name} port {self.port}{where} is in use by {self.holder}"


def bind_error(bind: str, port: int) -> int | None:
    """Bind as a server would (SO_REUSEADDR, so a TIME_WAIT left by an earlier run is no obstacle); the errno
    it fails with (EADDRINUSE: held; EADDRNOTAVAIL: not an address of this machine), None if it binds."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except socket.gaierror:
            return errno.EADDRNOTAVAIL  # a name that does not resolve here
        except OSError as exc:
            return exc.errno or errno.EADDRINUSE
    return None


def can_bind(bind: str, port: int) -> bool:
    return bind_error(bind, port) is None


def foreign_addresses(plan: Plan) -> dict[str, list[str]]:
    """Each address the plan binds that is not one of this machine's, and the roles that bind it."""
    out: dict[str, list[str]] = {}
    for spec in plan.specs:
        port = next(iter(spec.ports.values()), 0)
        if errno.EADDRNOTAVAIL == bind_error(spec.bind, port) == bind_error(spec.bind, 0):
            out.setdefault(spec.bind, []).append(spec.name)
    return out


def _blocks(listening_on: str, host: str | None) -> bool:
    """Does a listener on `listening_on` take the port from a server binding `host`?"""
    if host is None or host in WILDCARDS or listening_on in WILDCARDS:
        return True
    return listening_on in (host, f"::ffff:{host}")


def port_holder(
    port: int,
    host: str | None = None,
    roles: Mapping[int, str] | None = None,
    mask: Callable[[str], str] = lambda text: text,
    recorded: Callable[[psutil.Process], str | None] = lambda proc: None,
) -> str:
    """Who holds (host, port) (no host: any address). A role is named from `roles` (pid -> role), else
    from the marker in its environment (which a process that sets its title, like sglang-router, wipes).
    A role is described by its program alone (its command line may hold its deployment's secrets, which this
    one cannot know); any other process by its command line, secret-looking flags' values hidden, and what
    `mask` hides (proc/masks.py). `recorded` names a role a running deployment recorded (rundir/state.py's
    recorded_role: passed in, this layer reads no deployment state)."""
    for conn in psutil.net_connections(kind="inet"):
        if (
            not conn.laddr
            or conn.laddr.port != port
            or conn.status not in (psutil.CONN_LISTEN, psutil.CONN_NONE)
        ):
            continue
        if not _blocks(conn.laddr.ip, host):
            continue
        if conn.pid is None:
            return "a process this user cannot see"
        try:
            proc = psutil.Process(conn.pid)
            command = mask(command_line(proc.cmdline()))[:100] or proc.name()
        except psutil.Error:
            return f"pid {conn.pid}"
        role = (roles or {}).get(conn.pid)
        if role is None:
            try:
                environ = proc.environ()
                role = (
                    f"{environ[MARKER_ROLE]} of {environ.get(MARKER_DEPLOYMENT)}"
                    if MARKER_ROLE in environ
                    else None
                )
            except psutil.Error:
                pass
        role = role or recorded(proc)  # sglang-router sets its title, which wipes its environment
        if role:
            try:
                command = os.path.basename((proc.cmdline() or [""])[0]) or proc.name()
            except psutil.Error:
                pass
        return f"pid {conn.pid} ({'role ' + role + ', ' if role else ''}{command})"
    return local_end_holder(port) or "an unknown process"


def local_end_holder(port: int) -> str | None:
    """A connection that took PORT as its local end (the kernel hands out 32768-60999 that way): whose."""
    for conn in psutil.net_connections(kind="inet"):
        if conn.laddr and conn.laddr.port == port and conn.raddr:
            who = f"pid {conn.pid}" if conn.pid else "a process this user cannot see"
            return (
                f"{who}'s connection to {conn.raddr.ip}:{conn.raddr.port} ({conn.status}; the kernel gave it "
                f"this port as its local end: prefer ports below 32768)"
            )
    return None


HELD_BY_DEPLOYMENT = re.compile(r"\(role [^,()]+ of ([^,()\s]+)[,)]")


def holding_deployments(busy: list[BusyPort]) -> list[str]:
    """The other muse-launch deployments that hold some of these ports, in order."""
    return list(dict.fromkeys(m.group(1) for b in busy if (m := HELD_BY_DEPLOYMENT.search(b.holder))))


def busy_ports(
    plan: Plan,
    mask: Callable[[str], str] = lambda text: text,
    recorded: Callable[[psutil.Process], str | None] = lambda proc: None,
) -> list[BusyPort]:
    return [
        BusyPort(spec.name, name, port, port_holder(port, spec.bind, mask=mask, recorded=recorded), spec.bind)
        for spec in plan.specs
        for name, port in spec.ports.items()
        if not can_bind(spec.bind, port)
    ]


def taken_ports(
    spec: LaunchSpec,
    roles: Mapping[int, str],
    recorded: Callable[[psutil.Process], str | None] = lambda proc: None,
) -> list[str]:
    """After a role exited: which of its ports someone else holds now (a likely reason it exited)."""
    return [
        f"its {name} port {port}{'' if spec.bind in DEFAULT_ADDRESSES else ' on ' + spec.bind} is in use by "
        f"{port_holder(port, spec.bind, roles, recorded=recorded)}"
        for name, port in spec.ports.items()
        if not can_bind(spec.bind, port)
    ]


def is_listening(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except OSError:
        return False
    return True
