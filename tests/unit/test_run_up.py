"""`up`'s preparations: --only, the port preflight."""

from __future__ import annotations

import os
import socket

import pytest

from muse_launch.errors import UsageError
from muse_launch.local.up import select_only
from muse_launch.plan.spec import LaunchSpec, Plan
from muse_launch.proc.ports import busy_ports


def spec(name: str, role: str, port: int, *depends_on: str) -> LaunchSpec:
    return LaunchSpec(
        name=name,
        role=role,
        kind="command",
        engine="command",
        launcher=("serve",),
        args=(),
        ports={"http": port},
        depends_on=depends_on,
    )


ROUTER = spec("router", "router", 8000, "prefill", "decode-0", "decode-1")
PLAN = Plan(
    "pd",
    (
        spec("prefill", "prefill", 30001),
        spec("decode-0", "decode", 30002),
        spec("decode-1", "decode", 30003),
        ROUTER,
    ),
    (("decode-0", "decode-1", "prefill"), ("router",)),
)


def test_only_keeps_a_role_with_all_its_replicas_and_names_what_it_assumes():
    plan, assumed = select_only(PLAN, "decode")
    assert [s.name for s in plan.specs] == ["decode-0", "decode-1"]
    assert plan.waves == (("decode-0", "decode-1"),) and assumed == []
    plan, assumed = select_only(PLAN, "router")
    assert [s.name for s in plan.specs] == ["router"]
    assert assumed == [
        "decode-0 (http://127.0.0.1:30002)",
        "decode-1 (http://127.0.0.1:30003)",
        "prefill (http://127.0.0.1:30001)",
    ]
    with pytest.raises(UsageError, match="--only nope: no such role; roles: prefill, decode-0"):
        select_only(PLAN, "nope")


def test_preflight_names_the_process_holding_a_port():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        plan = Plan("one", (spec("prefill", "prefill", port),), (("prefill",),))
        [busy] = busy_ports(plan)
    assert str(busy).startswith(f"roles.prefill http port {port} is in use by pid {os.getpid()} (")
    assert busy_ports(plan) == []


def test_a_program_missing_here_is_refused_before_anything_starts(tmp_path):
    """A router not installed (vllm-router without `.[routers]`) used to fail `up` only once its
    workers had loaded, minutes in."""
    from dataclasses import replace

    from muse_launch.errors import RuntimeFailure
    from muse_launch.local.up import missing_programs, refuse_missing_programs

    here = replace(spec("prefill", "prefill", 30001), launcher=("sh",), args=("-c", "true"))
    not_there = replace(ROUTER, launcher=("muse-launch-no-such-router",))
    no_file = replace(spec("decode", "decode", 30002), launcher=(str(tmp_path / "bin" / "serve"),))
    plan = Plan("pd", (here, no_file, not_there), (("prefill", "decode"), ("router",)))
    assert missing_programs(Plan("pd", (here,), (("prefill",),))) == []
    assert missing_programs(plan) == [
        f"decode: {tmp_path / 'bin' / 'serve'} is not an executable file",
        "router: cannot run 'muse-launch-no-such-router' (not on PATH, nor beside "
        f"{__import__('sys').executable})",
    ]
    with pytest.raises(RuntimeFailure) as refused:
        refuse_missing_programs(plan)
    assert "nothing was started" in str(refused.value) and "[routers]" in refused.value.fix


def test_a_busy_port_says_how_to_move_the_role():
    """The `--set` names the file's role and key, also for a replica, a node rank or a second side channel."""
    from muse_launch.local.up import busy_fix
    from muse_launch.proc.ports import BusyPort

    def spec(name: str, role: str) -> LaunchSpec:
        return LaunchSpec(name, role, "decode", "vllm", ("serve",), ())

    plan = Plan(
        "p",
        (spec("router", "router"), spec("prefill@tray0", "prefill"), spec("decode-1", "decode")),
        (("router", "prefill@tray0", "decode-1"),),
    )
    move = "stop what holds it, or move the role: `--set roles.{}=PORT`"
    assert busy_fix(plan, [BusyPort("router", "http", 8000, "pid 1 (x)")]) == move.format("router.port")
    assert busy_fix(plan, [BusyPort("prefill@tray0", "bootstrap", 8998, "pid 1 (x)")]) == move.format(
        "prefill.bootstrap_port"
    )
    assert busy_fix(plan, [BusyPort("decode-1", "side_channel_1", 5601, "pid 1 (x)")]) == move.format(
        "decode.side_channel_port"
    )


def test_down_of_a_deployment_with_nothing_running_says_so_plainly():
    from muse_launch.backend_types import DownReport

    assert DownReport("pd", 0.05, (), (), (), (), ()).lines() == ["pd: nothing was running; checked in 0.05s"]
    assert DownReport("pd", 1.5, ("router", "prefill"), (), (), (), ()).lines() == [
        "pd: stopped router, prefill in 1.50s"
    ]


def test_a_missing_program_named_by_a_secret_is_not_printed():
    from dataclasses import replace

    from muse_launch.errors import RuntimeFailure
    from muse_launch.local.up import refuse_missing_programs

    secret = replace(ROUTER, launcher=("/opt/secret-place/router",))
    with pytest.raises(RuntimeFailure) as refused:
        refuse_missing_programs(
            Plan("pd", (secret,), (("router",),)),
            lambda text: text.replace("/opt/secret-place/router", "***"),
        )
    assert "secret-place" not in str(refused.value) and "router: *** is not an executable file" in str(
        refused.value
    )


def test_only_refuses_at_once_when_what_the_role_needs_is_not_up():
    """`up --only router` with nothing else up used to wait the router's whole timeout, then fail."""
    import http.server
    import threading

    import httpx

    from muse_launch.local.up import absent_dependencies

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        up = server.server_address[1]
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            down = unused.getsockname()[1]
        plan = Plan(
            "pd",
            (
                spec("prefill", "prefill", up),
                spec("decode-0", "decode", down),
                spec("router", "router", 8000, "prefill", "decode-0"),
            ),
            (("decode-0", "prefill"), ("router",)),
        )
        with httpx.Client() as client:
            assert absent_dependencies(plan, "router", client) == [
                f"decode-0 (http://127.0.0.1:{down}): GET /health: connection refused"
            ]
            assert absent_dependencies(plan, "prefill", client) == []
        server.shutdown()


def test_a_port_taken_as_a_connections_local_end_says_so():
    """A fixed port in the ephemeral range may be held by an outgoing connection: not "an unknown process"."""
    from muse_launch.proc.ports import port_holder

    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as out,
    ):
        accepted, _ = server.accept()
        listening = server.getsockname()[1]
        with accepted:
            held = port_holder(out.getsockname()[1], "127.0.0.1")
    assert held.startswith(f"pid {os.getpid()}'s connection to 127.0.0.1:{listening} (ESTABLISHED; ")
    assert "prefer ports below 32768" in held
