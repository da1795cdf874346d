"""Whose listener answers a role's probe: a TCP connect or an HTTP 200 proves that something listens on
the port, not that the role does (two deployments given one port both reported
ready, the loser's process having survived its failed bind).

The kernel's socket tables (/proc/net/tcp, tcp6) give the listening socket's inode; the role's leader
and its descendants' /proc/PID/fd (and its cgroup's members, and a process carrying its marker) show
whether one of them holds it. Only for roles on this host (on
SLURM the supervisor cannot see the pids of other nodes), and only once per role process: the probe
caches a positive answer. Naming a holder that is not the role scans every process's fds, which is
done only when the role's own processes do not hold the socket.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

from muse_launch.proc.identity import holds_open

TCP_LISTEN = "0A"
# A container runtime's port forwarder holds the host port for a role run in a container
# (`launcher: [docker, run, ...]`); it is no descendant of the role, and still forwards to it.
PORT_FORWARDERS = ("docker-proxy", "rootlessport", "rootlesskit", "slirp4netns", "pasta", "conmon")
WILDCARDS = (ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::"))


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_addr)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    address = ipaddress.ip_address(words)
    return address.ipv4_mapped or address if isinstance(address, ipaddress.IPv6Address) else address


def _listeners(port: int | None) -> dict[int, list[tuple[str, int]]]:
    """port -> (hex address, inode) of each listening socket in the kernel's tables (only `port`'s when
    given)."""
    found: dict[int, list[tuple[str, int]]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            hex_addr, _, hex_port = fields[1].partition(":")
            number = int(hex_port, 16)
            if port is None or number == port:
                found.setdefault(number, []).append((hex_addr, int(fields[9])))
    return found


def _matching(listeners: list[tuple[str, int]], host: str | None) -> set[int]:
    try:
        wanted = ipaddress.ip_address(host) if host else None
    except ValueError:
        wanted = None
    return {
        inode
        for hex_addr, inode in listeners
        if wanted is None or (address := _address(hex_addr)) == wanted or address in WILDCARDS
    }


def listening_inodes(port: int, host: str | None = None) -> set[int]:
    """Inodes of the sockets listening on `port` at `host` (or at a wildcard address); any address when
    `host` is not an IP literal."""
    return _matching(_listeners(port).get(port, []), host)


class HostView:
    """One look at the host for a whole `status` or `top` reading: the socket tables parsed once and the
    process tree walked once, however many roles ask (per role, each look cost the host's whole socket
    table and process list: 1.2 s at 64 instances)."""

    def __init__(self) -> None:
        self._listeners: dict[int, list[tuple[str, int]]] | None = None
        self._children: dict[int, list[int]] | None = None

    def inodes(self, port: int, host: str | None) -> set[int]:
        if self._listeners is None:
            self._listeners = _listeners(None)
        return _matching(self._listeners.get(port, []), host)

    def tree(self, pid: int) -> list[int]:
        if self._children is None:
            self._children = {}
            for proc in psutil.process_iter(["ppid"]):
                self._children.setdefault(proc.info["ppid"], []).append(proc.pid)
        out, todo = [], [pid]
        while todo:
            one = todo.pop()
            out.append(one)
            todo += [c for c in self._children.get(one, ()) if c != one]
        return out


def _tree(pid: int) -> list[int]:
    try:
        leader = psutil.Process(pid)
        return [pid, *(c.pid for c in leader.children(recursive=True))]
    except psutil.Error:
        return []


@dataclass(frozen=True)
class Holder:
    pid: int | None
    name: str
    command: str  # "pid N (cmd)", or what is known when no process could be named

    @property
    def forwarder(self) -> bool:
        return self.name in PORT_FORWARDERS


def holder(inodes: set[int], describe) -> Holder:
    sockets = {f"socket:[{i}]" for i in inodes}
    for proc in psutil.process_iter():
        if holds_open(proc.pid, sockets):
            try:
                name = proc.name()
            except psutil.Error:
                name = ""
            return Holder(proc.pid, name, describe(proc))
    return Holder(None, "", "a process this user cannot see")


@dataclass
class ListenerOwner:
    """Does the listener on a role's port belong to the role (its leader or a descendant, or a process
    carrying its marker)? `check` returns None when it does (or cannot be told: no listener visible
    from here, as with a container's DNAT), else what holds it."""

    pid: int
    role: str
    marker: Mapping[str, str]  # the role's marker variables: a descendant that left the tree still has them
    cgroup: str | None = None  # the role's own cgroup: holds even a descendant that cleared its environment
    confirmed: bool = False
    _other: tuple[frozenset[int], Holder] | None = None  # the last holder named: not looked for again
    view: HostView | None = None  # shared by the roles of one `status` or `top` reading

    def check(self, port: int, host: str | None) -> str | None:
        if self.confirmed:
            return None
        inodes = self.view.inodes(port, host) if self.view else listening_inodes(port, host)
        if not inodes:
            return None
        sockets = {f"socket:[{i}]" for i in inodes}
        from muse_launch.proc import cgroups

        tree = self.view.tree(self.pid) if self.view else _tree(self.pid)
        if any(holds_open(pid, sockets) for pid in {*tree, *cgroups.members(self.cgroup)}):
            self.confirmed = True
            return None
        if self._other is None or self._other[0] != frozenset(inodes):
            from muse_launch.proc.process import describe

            self._other = (
                frozenset(inodes),
                holder(inodes, describe),
            )  # every process's fds: once per listener
        found = self._other[1]
        if found.forwarder or (found.pid is not None and _marked(found.pid, self.marker)):
            self.confirmed = True
            return None
        return f"port {port} answers, but the listener is {found.command}, not role {self.role}"


def _marked(pid: int, marker: Mapping[str, str]) -> bool:
    try:
        environ = psutil.Process(pid).environ()
    except psutil.Error:
        return False
    return all(environ.get(k) == v for k, v in marker.items())
