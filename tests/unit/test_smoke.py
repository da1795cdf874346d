"""`smoke` asks the router which model it serves, and fails cleanly (exit 1, no traceback) when the
deployment is gone: stopped, its state lost or damaged, its router not answering."""

from __future__ import annotations

import json
import os
import socket
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from cli_run import muse
from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
from muse_launch.run.lifecycle import RoleState
from muse_launch.run.process import ProcessRef
from muse_launch.run.state import RunDir, planned_record, write_state


class FakeRouter(ThreadingHTTPServer):
    """/v1/models lists `models`; a chat completion streams one token and records the model asked for."""

    daemon_threads = True

    def __init__(self, models: list[str]):
        super().__init__(("127.0.0.1", 0), Handler)
        self.models = models
        self.asked: list[str] = []


class Handler(BaseHTTPRequestHandler):
    server: FakeRouter

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]})
        self._send(200, "application/json", body.encode())

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.asked.append(request["model"])
        if request["model"] not in self.server.models:
            self._send(404, "application/json", b'{"error": {"message": "model not found"}}')
            return
        chunk = {"choices": [{"delta": {"content": "SGLang serves models."}, "finish_reason": "stop"}]}
        self._send(200, "text/event-stream", f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())

    def _send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MUSE_LAUNCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def router(request: pytest.FixtureRequest) -> Iterator[FakeRouter]:
    server = FakeRouter(getattr(request, "param", ["unknown", "muse-served"]))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def deployment(router_port: int, state: RoleState = RoleState.READY, supervised: bool = True) -> RunDir:
    """A deployment record as `up -d` leaves it: a worker serving under another name, a router in front."""
    plan = Plan("demo", (
        LaunchSpec(name="decode", role="decode", kind="decode", engine="sglang", launcher=("sglang", "serve"),
                   args=("--served-model-name", "a-name-the-router-does-not-list"), ports={"http": free_port()}),
        LaunchSpec(name="router", role="router", kind="router", engine="sglang-router", launcher=("sglang-router",),
                   args=(), ports={"http": router_port}, probe=Probe(ProbeKind.HTTP, ("/health",)),
                   depends_on=("decode",)),
    ), (("decode",), ("router",)))
    record = planned_record(plan, "demo.yaml", str)
    record = replace(record, roles=tuple(replace(r, state=state) for r in record.roles))
    if supervised:  # this test process stands in for a live supervisor
        record = replace(record, supervisor=ProcessRef(os.getpid(), psutil.Process().create_time()))
    run_dir = RunDir.of("demo")
    write_state(run_dir, record)
    return run_dir


def test_smoke_asks_for_the_model_the_router_lists(home: Path, router: FakeRouter) -> None:
    deployment(router.server_address[1])
    run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 0, run.stdout + run.stderr
    assert router.asked == ["muse-served"]  # not "unknown", not the worker's argv
    assert "ok   models" in run.stdout and "muse-served" in run.stdout
    assert "ok   chat" in run.stdout


@pytest.mark.parametrize("router", [[], ["unknown"]], indirect=True, ids=["empty", "unknown"])
def test_smoke_fails_when_the_router_lists_no_model(home: Path, router: FakeRouter) -> None:
    deployment(router.server_address[1])
    run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL models" in run.stdout and "no worker registered" in run.stdout
    assert router.asked == []


def test_smoke_when_the_router_does_not_answer(home: Path) -> None:
    deployment(free_port())
    run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL models" in run.stdout and "nothing answers at http://127.0.0.1:" in run.stdout
    assert "fix: `muse-launch status demo`" in run.stdout


def test_smoke_of_a_deployment_with_nothing_alive(home: Path) -> None:
    deployment(free_port(), supervised=False)  # no supervisor, no process: every role is gone
    run = muse("smoke", "demo")
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.splitlines() == ["error: deployment 'demo' is not running: no role of it is alive",
                                       "  fix: muse-launch up demo.yaml -d"]


def test_smoke_when_the_state_is_gone_or_damaged(home: Path) -> None:
    run_dir = deployment(free_port())
    run_dir.state_file.write_text('{"name": "demo", "roles": [')
    damaged = muse("smoke", "demo")
    assert damaged.returncode == 1 and "state.json is damaged" in damaged.stderr, damaged.stderr
    run_dir.state_file.unlink()
    gone = muse("smoke", "demo")
    assert gone.returncode == 1 and "has no state any more" in gone.stderr, gone.stderr
    assert "fix: `muse-launch down demo`" in gone.stderr


def test_smoke_with_nothing_running_says_how_to_start(home: Path) -> None:
    run = muse("smoke")
    assert run.returncode == 1
    assert run.stderr.startswith("error: no deployment is running\n  fix: `muse-launch up FILE -d`")
