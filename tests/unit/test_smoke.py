"""`smoke` asks the router which model it serves, and fails cleanly (exit 1, no traceback) when the
deployment is gone: stopped, its state lost or damaged, its router not answering."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_run import muse

from muse_launch.plan.spec import LaunchSpec, Plan, Probe, ProbeKind
from muse_launch.proc.process import ProcessRef
from muse_launch.rundir.lifecycle import RoleState
from muse_launch.rundir.state import RunDir, write_state
from muse_launch.supervise.planned_record import planned_record


class FakeRouter(ThreadingHTTPServer):
    """/v1/models lists `models`; a chat completion for one of `serves` streams one token. Records the
    model each request asked for."""

    daemon_threads = True

    def __init__(self, models: list[str], serves: tuple[str, ...] = ()):
        super().__init__(("127.0.0.1", 0), Handler)
        self.models = models
        self.serves = set(serves) | set(models)
        self.asked: list[str] = []


class Handler(BaseHTTPRequestHandler):
    server: FakeRouter

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = json.dumps(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in self.server.models]}
        )
        self._send(200, "application/json", getattr(self.server, "raw", None) or body.encode())

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.asked.append(request["model"])
        if request["model"] not in self.server.serves:
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


@contextlib.contextmanager
def serving(models: list[str], serves: tuple[str, ...] = ()) -> Iterator[FakeRouter]:
    server = FakeRouter(models, serves)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def router(request: pytest.FixtureRequest) -> Iterator[FakeRouter]:
    with serving(getattr(request, "param", ["unknown", "muse-served"])) as server:
        yield server


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return s.getsockname()[1]


def deployment(
    router_port: int,
    state: RoleState = RoleState.READY,
    supervised: bool = True,
    worker_port: int | None = None,
    served: str | None = "declared-name",
) -> RunDir:
    """A deployment record as `up -d` leaves it: a worker (whose argv declares `served`), a router in
    front."""
    plan = Plan(
        "demo",
        (
            LaunchSpec(
                name="decode",
                role="decode",
                kind="decode",
                engine="sglang",
                launcher=("sglang", "serve"),
                args=("--served-model-name", served) if served else (),
                ports={"http": worker_port or free_port()},
            ),
            LaunchSpec(
                name="router",
                role="router",
                kind="router",
                engine="sglang-router",
                launcher=("sglang-router",),
                args=(),
                ports={"http": router_port},
                probe=Probe(ProbeKind.HTTP, ("/health",)),
                depends_on=("decode",),
            ),
        ),
        (("decode",), ("router",)),
    )
    record = planned_record(plan, "demo.yaml", str)
    record = replace(record, roles=tuple(replace(r, state=state) for r in record.roles))
    if supervised:  # this test process stands in for a live supervisor
        record = replace(record, supervisor=ProcessRef.of(os.getpid()))
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


def test_a_router_that_lists_unknown_defers_to_the_workers_own_list(home: Path) -> None:
    """sglang-router in front of vLLM lists "unknown" but routes by the name the worker serves."""
    with serving(["tiny"]) as worker, serving(["unknown"], serves=("tiny",)) as router:
        deployment(router.server_address[1], worker_port=worker.server_address[1])
        run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 0, run.stdout + run.stderr
    assert router.asked == ["tiny"]
    assert "ok   models" in run.stdout and "tiny (as http://127.0.0.1:" in run.stdout
    assert "the router lists 'unknown')" in run.stdout


@pytest.mark.parametrize("router", [[], ["unknown"]], indirect=True, ids=["empty", "unknown"])
def test_with_no_name_reported_the_declared_one_is_asked_for(home: Path, router: FakeRouter) -> None:
    deployment(router.server_address[1])  # the worker does not answer
    run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 1, run.stdout + run.stderr  # the fake router serves no such model
    assert router.asked == ["declared-name"]
    assert "ok   models" in run.stdout and "declared-name (--served-model-name;" in run.stdout


def test_smoke_fails_when_nothing_names_the_model(home: Path) -> None:
    with serving([]) as router:
        deployment(router.server_address[1], served=None)
        run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 1, run.stdout + run.stderr
    assert (
        "FAIL models" in run.stdout
        and "the router lists no model at /v1/models and no worker names" in run.stdout
    )
    assert router.asked == []


def test_smoke_when_the_router_does_not_answer(home: Path) -> None:
    deployment(free_port())
    run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL models" in run.stdout and "nothing answers at http://127.0.0.1:" in run.stdout
    assert "fix: `muse-launch status demo`" in run.stdout


def test_smoke_json_is_one_document_with_each_check_and_the_failure(home: Path) -> None:
    deployment(free_port())
    run = muse("smoke", "demo", "--timeout", "10", "--json")
    assert run.returncode == 1, run.stdout + run.stderr
    doc = json.loads(run.stdout)  # nothing but the document on stdout
    assert doc["name"] == "demo" and doc["ok"] is False and doc["url"].startswith("http://127.0.0.1:")
    assert [c["check"] for c in doc["checks"]][:1] == ["models"] and doc["checks"][0]["ok"] is False
    assert "nothing answers at http://127.0.0.1:" in doc["checks"][0]["detail"]


def test_down_json_with_nothing_running(home: Path) -> None:
    run = muse("down", "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(run.stdout) == {
        "name": None,
        "stopped": [],
        "clean": True,
        "notes": ["no deployment is running; nothing to stop"],
    }


def test_smoke_of_a_deployment_with_nothing_alive(home: Path) -> None:
    deployment(free_port(), supervised=False)  # no supervisor, no process: every role is gone
    run = muse("smoke", "demo")
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stderr.splitlines() == [
        "error: deployment 'demo' is not running: no role of it is alive",
        "  fix: muse-launch up demo.yaml -d",
    ]


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


def test_an_answer_is_printed_as_one_line_without_terminal_escapes() -> None:
    from muse_launch.smoke import one_line

    assert (
        one_line("Sure!\n\n  It is \x1b[2J\x1b[31mred\x1b[0m\x00.\r\n")
        == r"Sure! It is \x1b[2J\x1b[31mred\x1b[0m\x00."
    )
    assert one_line("café ☕") == "café ☕"


@pytest.mark.faults("18.7 exit 70 on user input: a server answering smoke with deeply nested JSON")
@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000 + b"]" * 100_000, b'{"data": ' * 50_000 + b"1" + b"}" * 50_000, b"[1]"],
    ids=["array", "object", "not an object"],
)
def test_a_deeply_nested_answer_fails_the_check_not_the_command(home: Path, router: FakeRouter, raw) -> None:
    router.raw = raw
    deployment(router.server_address[1])
    run = muse("smoke", "demo", "--timeout", "10")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAIL models" in run.stdout and "not an OpenAI model list" in run.stdout, run.stdout
    assert "fix: `muse-launch status demo`" in run.stdout
