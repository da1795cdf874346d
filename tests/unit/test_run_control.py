"""The supervisor's control socket (supervise/control_socket.py), the routers' worker API helpers
(supervise/workers.py) and
the fields a change adds to state.json: hostile input on both ends is refused, changes are serialized."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest
from wire_handler import WireHandler

from muse_launch.engines import router
from muse_launch.errors import NotSupported, RuntimeFailure, UsageError
from muse_launch.rundir.state import RunDir, record_from_json
from muse_launch.supervise.control_socket import SOCKET_NAME, ControlServer, parse_request, request
from muse_launch.supervise.workers import in_flight, load_in, running_in


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    d = RunDir(tmp_path / "demo")
    d.path.mkdir()
    return d


def test_a_request_is_answered_with_its_progress_lines_then_its_result(run_dir):
    def handler(op, args, say):
        say(f"doing {op} {args['role']}")
        return {"instance": "decode-1"}

    server = ControlServer(run_dir, WireHandler(handler))
    try:
        lines: list[str] = []
        assert request(run_dir, "add", {"role": "decode"}, lines.append) == {"instance": "decode-1"}
        assert lines == ["doing add decode"]
    finally:
        server.close()
    assert not (run_dir.path / SOCKET_NAME).exists()  # the supervisor removes its socket when it goes


def test_the_error_a_change_refuses_with_reaches_the_client_as_the_same_kind(run_dir):
    def handler(op, args, say):
        raise NotSupported("vllm-router takes no worker at run time", fix="route with smg")

    server = ControlServer(run_dir, WireHandler(handler))
    try:
        with pytest.raises(NotSupported, match="vllm-router") as caught:
            request(run_dir, "add", {"role": "decode"}, print)
        assert caught.value.fix == "route with smg"
    finally:
        server.close()


def test_a_second_change_while_one_runs_is_refused_at_once(run_dir):
    started, release = threading.Event(), threading.Event()

    def handler(op, args, say):
        started.set()
        release.wait(10)
        return {}

    server = ControlServer(run_dir, WireHandler(handler))
    try:
        first = threading.Thread(target=request, args=(run_dir, "add", {"role": "decode"}, print))
        first.start()
        assert started.wait(10)
        with pytest.raises(RuntimeFailure, match="another change is in progress"):
            request(run_dir, "remove", {"instance": "decode-1"}, print)
        assert first.is_alive()  # refused while the first change goes on, not after it
        release.set()
        first.join(10)
    finally:
        server.close()


def test_a_change_asked_for_the_moment_the_last_one_answered_is_served(run_dir, monkeypatch):
    """A rolling restart asks for the next instance as soon as the last one's answer arrives: the lock is
    free before the answer goes out, however late the serving thread runs after sending it (CI: a rolling
    restart was refused 'another change is in progress' between its two instances)."""
    from muse_launch.supervise import control_socket as control

    real_sender = control._sender

    def slow_after_the_answer(conn):
        send = real_sender(conn)

        def late(message):
            send(message)
            if "ok" in message:
                time.sleep(0.5)  # the serving thread descheduled right after the answer

        return late

    monkeypatch.setattr(control, "_sender", slow_after_the_answer)
    server = ControlServer(run_dir, WireHandler(lambda op, args, say: {"instance": args["instance"]}))
    try:
        for name in ("prefill-0", "prefill-1", "decode-0"):
            assert request(run_dir, "restart", {"instance": name, "allow_downtime": False}, print) == {
                "instance": name
            }
    finally:
        server.close()


def test_the_change_in_progress_is_named_in_words_not_as_its_arguments(run_dir):
    started, release = threading.Event(), threading.Event()

    def handler(op, args, say):
        started.set()
        release.wait(10)
        return {}

    server = ControlServer(run_dir, WireHandler(handler))
    try:
        args = {"instance": "prefill-0", "allow_downtime": False, "drain_timeout": 120.0}
        first = threading.Thread(target=request, args=(run_dir, "restart", args, print))
        first.start()
        assert started.wait(10)
        with pytest.raises(RuntimeFailure) as caught:
            request(run_dir, "remove", {"instance": "decode-1"}, print)
        assert str(caught.value) == "another change is in progress (restart prefill-0)"
        release.set()
        first.join(10)
    finally:
        server.close()


def test_a_planted_link_where_the_socket_goes_is_replaced_not_followed(run_dir, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, run_dir.path / SOCKET_NAME)
    server = ControlServer(run_dir, WireHandler(lambda op, args, say: {}))
    try:
        assert victim.read_text() == "keep me"
        assert not (run_dir.path / SOCKET_NAME).is_symlink()
    finally:
        server.close()


def test_the_client_refuses_what_is_not_a_socket_and_names_the_fix(run_dir, tmp_path):
    with pytest.raises(RuntimeFailure, match="no supervisor answers"):
        request(run_dir, "add", {"role": "decode"}, print)
    (run_dir.path / SOCKET_NAME).write_text("{}")
    with pytest.raises(RuntimeFailure, match="not the supervisor's socket"):
        request(run_dir, "add", {"role": "decode"}, print)
    os.unlink(run_dir.path / SOCKET_NAME)
    elsewhere = socket.socket(socket.AF_UNIX)
    elsewhere.bind(str(tmp_path / "other.sock"))
    elsewhere.listen(1)
    os.symlink(tmp_path / "other.sock", run_dir.path / SOCKET_NAME)  # a link to someone else's socket
    try:
        with pytest.raises(RuntimeFailure, match="not the supervisor's socket"):
            request(run_dir, "add", {"role": "decode"}, print)
    finally:
        elsewhere.close()


@pytest.mark.parametrize(
    "line",
    [
        b"[]",
        b'{"op": "rm -rf"}',
        b'{"op": "add", "args": []}',
        b'{"op": "add", "args": {"role": ["decode"]}}',
        b'{"op": "add", "args": {"role": "de\\u0000code"}}',
        b'{"op": "add", "args": {"role": "' + b"x" * 8193 + b'"}}',
    ],
)
def test_a_malformed_request_is_refused(line):
    with pytest.raises(ValueError):
        parse_request(line)


def test_a_hostile_answer_on_the_socket_is_refused_not_crashed_on(run_dir):
    """Whoever listens on the socket (a stale or planted server of this user) cannot make the client crash."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(f"{run_dir.path}/{SOCKET_NAME}")
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(b'{"say": 12}\n[1, 2]\nnot json\n')
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(RuntimeFailure, match="not JSON"):
            request(run_dir, "add", {"role": "decode"}, print)
    finally:
        server.close()


def test_a_bad_request_on_the_socket_gets_a_usage_error(run_dir):
    server = ControlServer(run_dir, WireHandler(lambda op, args, say: {}))
    try:
        with pytest.raises(UsageError, match="bad request"):
            request(run_dir, "explode", {}, print)
    finally:
        server.close()


def test_the_workers_in_flight_count_is_read_from_its_own_gauge_and_nonsense_is_ignored():
    text = "\n".join(
        [
            "# HELP sglang:num_running_reqs The number of running requests.",
            'sglang:num_running_reqs{model_name="m",engine="0"} 2.0',
            'sglang:num_running_reqs{model_name="m",engine="1"} 1',
            "sglang:num_running_reqs_other 40",
            "sglang:num_running_reqs NaN",
        ]
    )
    assert running_in(text, "sglang:num_running_reqs") == 3
    assert running_in("nothing here", "sglang:num_running_reqs") is None
    assert load_in([{"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 1}, {"num_reqs": 1}]) == 4
    # SGLang 0.5.23's /v1/loads
    loads = {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1}, {"num_running_reqs": 0}]}
    assert load_in(loads) == 3
    assert load_in({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]}) == 0
    assert load_in({"loads": [{"num_waiting_reqs": 3}]}) is None
    for hostile in ({"num_reqs": "2"}, [1], [{"num_reqs": True}], "x"):
        assert load_in(hostile) is None
    assert load_in({"loads": [{"num_running_reqs": 2, "num_reqs": 2}]}) == 2  # one count, not two


def _sglang_answering(metrics_running: int, loads: object | None) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=f'sglang:num_running_reqs{{engine="0"}} {metrics_running}\n')
        if request.url.path == "/v1/loads" and loads is not None:
            return httpx.Response(200, json=loads)
        return httpx.Response(404)

    return httpx.Client(transport=httpx.MockTransport(answer))


def test_a_drain_counts_the_schedulers_load_over_a_stale_gauge():
    # an idle SGLang prefill keeps its last batch's running gauge; its scheduler says 0
    idle = {"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}
    assert in_flight(_sglang_answering(3, idle), "sglang", "http://w") == 0
    busy = {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 1}]}
    assert in_flight(_sglang_answering(0, busy), "sglang", "http://w") == 3
    # no load endpoint answering (an older release, a hung scheduler): the gauges
    assert in_flight(_sglang_answering(3, None), "sglang", "http://w") == 3


def test_a_router_list_gives_ids_that_are_safe_in_a_url():
    answer = {
        "workers": [
            {"id": "b7989155-99de-490d-a7eb-3eec9e838128", "url": "http://127.0.0.1:30003/"},
            {"id": "../../admin", "url": "http://127.0.0.1:30004"},
            {"id": 7, "url": "http://127.0.0.1:30005"},
        ]
    }
    assert router.worker_ids(answer) == {"http://127.0.0.1:30003": "b7989155-99de-490d-a7eb-3eec9e838128"}
    assert router.worker_entry("prefill", "http://h:1", 8998) == {
        "url": "http://h:1",
        "worker_type": "prefill",
        "bootstrap_port": 8998,
    }
    assert router.worker_entry("decode", "http://h:2", None) == {"url": "http://h:2", "worker_type": "decode"}


def _state(change: dict | None = None, **role_fields) -> dict:
    from muse_launch.plan.spec import LaunchSpec, Plan
    from muse_launch.supervise.planned_record import planned_record

    spec = LaunchSpec("decode", "decode", "decode", "sglang", ("sglang", "serve"), (), ports={"http": 30002})
    data = planned_record(Plan("demo", (spec,), (("decode",),)), "demo.yaml", str).to_json()
    data["roles"][0].update(role_fields)
    data["change"] = change
    return json.loads(json.dumps(data))


def test_a_change_and_a_generation_in_state_json_are_checked_on_read():
    good = _state({"what": "add decode-1", "since": "2026-12-02T00:00:00+00:00"}, generation=2)
    checked = record_from_json(good, "demo", "/x/demo")
    assert checked.roles[0].generation == 2 and checked.change.what == "add decode-1"
    from muse_launch.bounded_json import Damaged

    for bad in (
        _state(generation=-1),
        _state(generation="2"),
        _state({"what": "add\x1b[2J", "since": "2026-12-02T00:00:00+00:00"}),
        _state({"what": "add decode-1", "since": "yesterday"}),
        _state({"what": "", "since": "2026-12-02T00:00:00+00:00"}),
    ):
        with pytest.raises(Damaged):
            record_from_json(bad, "demo", "/x/demo")


def test_a_deployment_with_a_change_in_progress_shows_as_changing_in_ls_and_status():
    from dataclasses import replace

    from muse_launch.local.status import local_view
    from muse_launch.plan.spec import LaunchSpec, Plan
    from muse_launch.render_status import status_table
    from muse_launch.rundir.lifecycle import RoleState
    from muse_launch.rundir.state import Change
    from muse_launch.supervise.planned_record import planned_record

    spec = LaunchSpec("decode", "decode", "decode", "sglang", ("sglang", "serve"), (), ports={"http": 30002})
    record = planned_record(Plan("demo", (spec,), (("decode",),)), "demo.yaml", str)
    record = record.with_role(replace(record.roles[0], state=RoleState.READY, generation=3))
    assert record.shown_state == "ready"
    changing = replace(
        record, change=Change("add decode-1 (scale decode 1 -> 2)", "2026-12-02T00:00:00+00:00")
    )
    assert changing.shown_state == "changing"
    table = status_table(local_view(changing, {"decode": "ok"}))
    assert "changing" in str(table.title) and "add decode-1 (scale decode 1 -> 2)" in str(table.title)
    assert [c.header for c in table.columns][-2] == "gen" and list(table.columns[-2].cells) == ["3"]
    stopped = replace(changing, roles=(replace(changing.roles[0], state=RoleState.STOPPED),))
    assert stopped.shown_state == "stopped"  # nothing runs: no change shown


# ---- the channel cannot be wedged: every wait bounded, every request with a whole-request deadline -------


def _raw(run_dir: RunDir) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(10)
    conn.connect(str(run_dir.path / SOCKET_NAME))
    return conn


def _last_line(conn: socket.socket) -> dict:
    """The server's lines until it closes; the last one (its answer)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    lines = [json.loads(line) for line in data.splitlines() if line.strip()]
    assert lines, "the server closed without an answer"
    return lines[-1]


def test_running_out_of_file_descriptors_does_not_end_the_accept_loop(run_dir):
    import resource

    server = ControlServer(run_dir, WireHandler(lambda op, args, say: {"instance": "decode-1"}))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler: list[int] = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        try:
            while True:
                filler.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass  # not one descriptor left in this process: the server's accept fails with EMFILE
        waiting.connect(str(run_dir.path / SOCKET_NAME))  # queued; accepting it needs a descriptor
        deadline = time.monotonic() + 30  # the accept loop meets EMFILE (on main: it ended there for good)
        while server.accept_failures == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.accept_failures > 0, "the accept loop never met EMFILE"
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        waiting.close()
        began = time.monotonic()
        assert request(run_dir, "add", {"role": "decode"}, print, timeout=10) == {"instance": "decode-1"}
        assert time.monotonic() - began < 5
        assert server.thread.is_alive()
    finally:
        server.close()


def test_a_supervisor_that_never_takes_the_request_is_given_up_on_in_seconds(run_dir, monkeypatch):
    """Connected, never accepted (an accept loop that is gone): the client's wait is bounded."""
    from muse_launch.supervise import control_socket as control

    monkeypatch.setattr(control, "TAKEN_TIMEOUT", 0.5)
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deaf.bind(str(run_dir.path / SOCKET_NAME))
    deaf.listen(8)
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            request(run_dir, "add", {"role": "decode"}, print)
        except BaseException as exc:  # noqa: BLE001  handed to the test
            outcome.append(exc)

    try:
        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        asking.join(10)
        assert not asking.is_alive(), "the client still waits"
        assert isinstance(outcome[0], RuntimeFailure) and "did not take the request" in str(outcome[0])
    finally:
        deaf.close()


def test_a_supervisor_that_goes_silent_mid_change_is_given_up_on(run_dir, monkeypatch):
    from muse_launch.supervise import control_socket as control

    monkeypatch.setattr(control, "SILENCE_TIMEOUT", 0.5)
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(str(run_dir.path / SOCKET_NAME))
    stuck.listen(1)
    held: list[socket.socket] = []

    def take_then_hang() -> None:
        conn, _ = stuck.accept()
        held.append(conn)
        conn.recv(4096)
        conn.sendall(b'{"taken": true}\n{"say": "starting decode-1"}\n')

    threading.Thread(target=take_then_hang, daemon=True).start()
    try:
        began = time.monotonic()
        with pytest.raises(RuntimeFailure, match="went silent"):
            request(run_dir, "add", {"role": "decode"}, print)
        assert time.monotonic() - began < 5
    finally:
        for conn in held:
            conn.close()
        stuck.close()


def test_a_long_change_is_not_given_up_on_while_the_supervisor_beats(run_dir, monkeypatch):
    from muse_launch.supervise import control_socket as control

    monkeypatch.setattr(control, "SILENCE_TIMEOUT", 0.6)
    monkeypatch.setattr(control, "BEAT", 0.1)

    def slow(op, args, say):
        time.sleep(1.5)  # longer than the silence the client bears: the beats carry it
        return {"instance": "decode-1"}

    server = ControlServer(run_dir, WireHandler(slow))
    try:
        assert request(run_dir, "add", {"role": "decode"}, print) == {"instance": "decode-1"}
    finally:
        server.close()


def test_a_request_trickled_a_byte_at_a_time_is_dropped_at_its_whole_request_deadline(run_dir, monkeypatch):
    from muse_launch.supervise import control_socket as control

    monkeypatch.setattr(control, "REQUEST_READ_TIMEOUT", 1.0)
    server = ControlServer(run_dir, WireHandler(lambda op, args, say: {}))
    try:
        conn = _raw(run_dir)
        conn.setblocking(True)
        began = time.monotonic()
        answer: list[dict] = []
        reader = threading.Thread(target=lambda: answer.append(_last_line(conn)), daemon=True)
        reader.start()
        for byte in b'{"op": "add", "args": {"role": "decode"}}'[:25]:
            if answer or time.monotonic() - began > 4:
                break
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                break  # dropped
            time.sleep(0.2)  # each byte well within any per-read timeout
        reader.join(5)
        assert answer and answer[0]["ok"] is False and "not sent whole within 1s" in answer[0]["error"]
        assert time.monotonic() - began < 3
        conn.close()
    finally:
        server.close()


def test_deeply_nested_json_is_answered_a_clear_error_and_the_server_goes_on(run_dir):
    server = ControlServer(run_dir, WireHandler(lambda op, args, say: {"instance": "decode-1"}))
    try:
        conn = _raw(run_dir)
        conn.sendall(b"[" * 50_000 + b"\n")
        answer = _last_line(conn)
        conn.close()
        assert answer["ok"] is False and answer["kind"] == "usage"
        assert "bad request" in answer["error"] and "nested more than" in answer["error"]
        assert "Error" not in answer["error"]  # no internal class name
        assert request(run_dir, "add", {"role": "decode"}, print) == {"instance": "decode-1"}
    finally:
        server.close()


def test_an_env_value_far_over_8_kib_is_handed_over_whole_and_the_size_stays_bounded(run_dir):
    seen: dict = {}

    def handler(op, args, say):
        seen.update(args)
        return {"file": args["file"]}

    server = ControlServer(run_dir, WireHandler(handler))
    secret = "k" * (200 << 10)  # a certificate or a long token: 200 KiB
    try:
        args = {"file": "/x/demo.yaml", "sets": "[]", "env": json.dumps({"TLS_CERT": secret})}
        assert request(run_dir, "adopt", args, print) == {"file": "/x/demo.yaml"}
        assert json.loads(seen["env"]) == {"TLS_CERT": secret}
        with pytest.raises(UsageError, match="bad request"):  # still bounded
            request(run_dir, "adopt", {**args, "env": json.dumps({"X": "k" * (5 << 20)})}, print)
        with pytest.raises(UsageError, match="too long"):  # an instance's name is no place for it
            request(run_dir, "remove", {"instance": "k" * 10_000}, print)
    finally:
        server.close()


# ---- a lease: a change of several requests is one change -------------------------------------------------


def test_a_lease_keeps_every_other_change_out_between_its_requests_and_its_end_is_told(run_dir):
    calls: list[tuple[str, dict]] = []

    def handler(op, args, say):
        calls.append((op, args))
        return {"instance": args.get("instance", "")}

    server = ControlServer(run_dir, WireHandler(handler))
    try:
        token = request(run_dir, "hold", {"what": "restart decode, rolling over 2"}, print)["lease"]
        assert request(run_dir, "restart", {"instance": "decode-0", "lease": token}, print)
        with pytest.raises(RuntimeFailure) as caught:  # between two of its requests: a scale is refused
            request(run_dir, "add", {"role": "decode"}, print)
        assert str(caught.value) == "another change is in progress (restart decode, rolling over 2)"
        assert "wait for it to end" in caught.value.fix
        assert request(run_dir, "restart", {"instance": "decode-1", "lease": token}, print)
        request(run_dir, "release", {"lease": token, "commit": True}, print)
        assert calls[-1] == ("release", {"commit": True})
        assert request(run_dir, "add", {"role": "decode"}, print) == {"instance": ""}  # free again
        for op, args in (("restart", {"instance": "decode-0"}), ("release", {})):  # a lease that ended
            with pytest.raises(RuntimeFailure, match="no such lease"):
                request(run_dir, op, {**args, "lease": token}, print)
    finally:
        server.close()


def test_a_lease_whose_client_went_away_ends_by_itself_uncommitted(run_dir, monkeypatch):
    from muse_launch.supervise import control_socket as control

    monkeypatch.setattr(control, "LEASE_IDLE", 0.3)
    calls: list[tuple[str, dict]] = []

    def handler(op, args, say):
        calls.append((op, args))
        return {}

    server = ControlServer(run_dir, WireHandler(handler))
    try:
        request(run_dir, "hold", {"what": "up of demo.yaml"}, print)
        with pytest.raises(RuntimeFailure, match=r"in progress \(up of demo.yaml\)"):
            request(run_dir, "add", {"role": "decode"}, print)
        began = time.monotonic()
        while time.monotonic() - began < 5:
            try:
                request(run_dir, "add", {"role": "decode"}, print)
                break
            except RuntimeFailure:
                time.sleep(0.05)
        assert calls == [("release", {"commit": False}), ("add", {"role": "decode"})]
    finally:
        server.close()
