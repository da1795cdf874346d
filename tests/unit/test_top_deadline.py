"""A server that sends its status line and headers a byte at a time, each byte well within a read timeout,
holds a plain httpx request for as long as it likes; `top`'s client bounds the whole answer."""

import json
import os
import socket
import threading
import time
from dataclasses import replace

import pytest

from muse_launch.top.deadline import bounded_client
from muse_launch.top.prom import FetchError, fetch


@pytest.fixture
def trickler():
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.recv(65536)
                for b in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Slow: " + b"y" * 10_000:
                    if stop.wait(0.02):  # one byte every 20 ms: far inside any read timeout
                        break
                    try:
                        conn.send(bytes([b]))
                    except OSError:
                        break

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
    stop.set()
    thread.join(5)
    srv.close()


def test_fetch_of_a_header_trickle_ends_by_its_deadline(trickler):
    with bounded_client(3.0) as client:
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 0.5s"):
            fetch(client, trickler, deadline=0.5)
        assert time.monotonic() - started < 1.5
        started = time.monotonic()
        with pytest.raises(Exception, match="deadline|timed out|ReadTimeout") as err:
            client.get(trickler, timeout=1.0)  # a health probe: bounded by the client's 3 s
        assert "Timeout" in type(err.value).__name__
        assert time.monotonic() - started < 4.5


def test_status_of_a_role_that_trickles_its_headers_ends_within_the_probe_budget(
    trickler, tmp_path, monkeypatch
):
    """`status` asks each role's probe through the bounded client: a trickle counts as no answer."""
    from cli_run import muse

    from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
    from muse_launch.proc.identity import ProcessRef
    from muse_launch.rundir.lifecycle import RoleState
    from muse_launch.rundir.state import RunDir, write_state
    from muse_launch.supervise.planned_record import planned_record
    from muse_launch.supervise.probe import HTTP_TIMEOUT

    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path))
    port = int(trickler.rsplit(":", 1)[1].split("/")[0])
    spec = LaunchSpec(
        "decode", "decode", "decode", "sglang", ("sglang",), (), ports={"http": port},
        probe=Probe(ProbeKind.HTTP, ("/health",)),
    )  # fmt: skip
    record = planned_record(Plan("demo", (spec,), (("decode",),)), "demo.yaml", str)
    me = ProcessRef.of(os.getpid())  # a live process: its health is asked
    write_state(
        RunDir.of("demo"), record.with_role(replace(record.roles[0], state=RoleState.READY, process=me))
    )
    started = time.monotonic()
    ran = muse("status", "demo", "--json")
    assert time.monotonic() - started < HTTP_TIMEOUT + 5, ran
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["roles"][0]["health"] == "failing"


def test_smoke_of_a_router_that_trickles_its_headers_fails_by_its_timeout(trickler):
    from muse_launch.smoke import run_smoke

    base = trickler.rsplit("/", 1)[0]
    started = time.monotonic()
    results = run_smoke(base, reasoning=False, tools=False, timeout=1.0)
    assert time.monotonic() - started < 5
    assert not results[0].ok and "Timeout" in results[0].detail
