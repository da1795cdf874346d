"""Logs (tail, follow, prefixes) and readiness probes, on their own."""

from __future__ import annotations

import os
import socket
import subprocess

import psutil
import pytest

pytestmark = pytest.mark.integration  # starts processes


def test_a_listener_is_the_roles_only_when_it_or_a_descendant_holds_it():
    from muse_launch.proc.listeners import ListenerOwner, listening_inodes
    from muse_launch.proc.process import describe

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        assert listening_inodes(port, "127.0.0.1") and not listening_inodes(port, "127.0.0.2")
        assert ListenerOwner(os.getpid(), "me", {}).check(port, "127.0.0.1") is None
        with subprocess.Popen(["sleep", "30"]) as other:  # a role that holds no listener: not us
            someone = ListenerOwner(other.pid, "prefill", {"MUSE_LAUNCH_ROLE": "no-such-role"})
            seen = someone.check(port, "127.0.0.1")
            other.kill()
        # as `describe` shows any process: its command line fitted to a width, wherever the repo is cloned
        me = describe(psutil.Process())
        assert seen == f"port {port} answers, but the listener is {me}, not role prefill"
        assert ListenerOwner(os.getpid(), "me", {}).check(free := _free_port(), "127.0.0.1") is None, (
            free
        )  # none: can't tell
    finally:
        server.close()


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def test_one_host_view_reads_the_socket_tables_once_for_every_role(monkeypatch):
    """status and top look at every role's listener: with one HostView per reading, the host's socket tables
    are parsed once and its processes walked once, not once per role (linear in the deployment)."""
    from muse_launch.proc import listeners
    from muse_launch.proc.listeners import HostView, ListenerOwner

    reads, real = [], listeners._listeners
    monkeypatch.setattr(listeners, "_listeners", lambda port: reads.append(port) or real(port))
    walks, real_iter = [], listeners.psutil.process_iter
    monkeypatch.setattr(listeners.psutil, "process_iter", lambda *a: walks.append(a) or real_iter(*a))
    servers = [socket.create_server(("127.0.0.1", 0)) for _ in range(5)]
    try:
        with subprocess.Popen(["sleep", "30"]) as other:
            view = HostView()
            assert other.pid in view.tree(os.getpid())
            for server in servers:
                owner = ListenerOwner(os.getpid(), "me", {}, view=view)
                assert owner.check(server.getsockname()[1], "127.0.0.1") is None and owner.confirmed
            stranger = ListenerOwner(other.pid, "prefill", {"MUSE_LAUNCH_ROLE": "x"}, view=view)
            assert "not role prefill" in stranger.check(servers[0].getsockname()[1], "127.0.0.1")
            other.kill()
        assert reads == [None] and len(walks) == 1 + 1  # one tree walk; naming the stranger scans once
        assert view.inodes(servers[0].getsockname()[1], "127.0.0.2") == set()
    finally:
        for server in servers:
            server.close()
