"""Name the roles behind the addresses in an error: whose port a host:port is, and, for an address
no role listens on, which role's argv sent traffic there. A wiring mistake then reads as one."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from muse_launch.engines.router import PREFILL
from muse_launch.rundir.state import DeploymentRecord, RoleRecord

ADDRESS = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3}|localhost):(\d{1,5})(?!\d)")


def _hosts(role: RoleRecord) -> set[str]:
    """The addresses a role is reached at: where it is probed, and the host of its URL."""
    return {role.probe_host} | ({urlsplit(role.url).hostname} if role.url else set())


def _pointer(argv: tuple[str, ...], host: str, port: int) -> str | None:
    """The arguments that send traffic to host:port: a URL or address, or a router's `--prefill URL PORT`."""
    flag = None
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            flag = arg
        elif f"{host}:{port}" in arg:
            return f"{flag} {arg}" if flag else arg
        if (
            arg == PREFILL
            and i + 2 < len(argv)
            and argv[i + 2] == str(port)
            and urlsplit(argv[i + 1]).hostname == host
        ):
            # the prefill's KV bootstrap port, as the router tells decode
            return f"{PREFILL} {argv[i + 1]} {port}"
    return None


def explain_addresses(text: str, record: DeploymentRecord, unknown_only: bool = False) -> list[str]:
    """One line per address in `text`; `unknown_only`: only addresses no role of the deployment listens on."""
    out = []
    for host, number in dict.fromkeys(ADDRESS.findall(text)):
        host, port = "127.0.0.1" if host == "localhost" else host, int(number)
        owners = [
            f"{r.name}'s {kind} port"
            for r in record.roles
            for kind, p in r.ports.items()
            if p == port and host in _hosts(r)
        ]
        if owners:
            if not unknown_only:
                out.append(f"{host}:{port} is {' and '.join(owners)}")
            continue
        told = [f"{r.name} ({arg})" for r in record.roles if (arg := _pointer(r.argv, host, port))]
        out.append(
            f"{host}:{port}: no role of {record.name} listens there"
            + (f"; it comes from {', '.join(told)}" if told else "")
        )
    return out
