"""Addresses: which are wildcards (listen everywhere, reach nowhere), which are this host's loopback."""

from __future__ import annotations

WILDCARDS = ("0.0.0.0", "::", "[::]", "")


def is_wildcard(host: str | None) -> bool:
    return host is None or host in WILDCARDS


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def connect_host(bind: str) -> str:
    """Where to reach a server that listens on `bind`: a wildcard is reached on loopback."""
    if bind in ("::", "[::]"):
        return "::1"
    return "127.0.0.1" if is_wildcard(bind) else bind
