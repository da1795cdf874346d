"""How a command reaches a running supervisor: a unix socket, `control.sock` in the run directory.

The supervisor owns the socket (it unlinks whatever has the name, binds a fresh one, and removes it when it
goes). A client is served only when it runs as the supervisor's own user (SO_PEERCRED). One request per
connection: a JSON object on one line, `{"op": ..., "args": {...}}`; the answer is JSON lines, `{"say":
TEXT}` as the change goes, then `{"ok": true, "result": {...}}` or `{"ok": false, "error": ..., "fix": ...}`.
Changes are serialized: while one runs, another request is answered at once that one is in progress.

Both ends treat what they read as hostile: the run directory (the socket is opened through the directory's
descriptor, never through a link: it must be a socket of this user), and every line (bounded, parsed, each
field's type checked). A client that goes away does not stop a change half-way.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from typing import Any

from muse_launch.errors import NotSupported, RuntimeFailure, UsageError, UserError
from muse_launch.rundir.state import RunDir

SOCKET_NAME = "control.sock"
MAX_LINE = 64 << 10  # a request, or one line of an answer
MAX_ANSWER_LINES = 100_000
REQUEST_READ_TIMEOUT = 5.0  # a client that connects and says nothing is dropped
OPS = ("add", "remove", "restart", "adopt", "scale")
MAX_VALUE = 8192  # one string argument (a file's path, its --set values as JSON)
ERROR_KINDS = {"usage": UsageError, "not_supported": NotSupported, "failure": RuntimeFailure}

Handler = Callable[[str, dict[str, Any], Callable[[str], None]], dict[str, Any]]


class ControlServer:
    """The supervisor's end: a thread accepts; each request runs `handler(op, args, say)` in a thread of
    its own, one at a time. `handler` raises a UserError to refuse."""

    def __init__(self, run_dir: RunDir, handler: Handler):
        self.run_dir = run_dir
        self.handler = handler
        self.busy = threading.Lock()
        self.busy_with: str | None = None
        self.dir_fd = os.open(run_dir.path, os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(SOCKET_NAME, dir_fd=self.dir_fd)  # whatever has the name: a link is removed, unfollowed
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o077)
        try:  # through the directory's descriptor: no path length limit, no link followed on the way
            self.sock.bind(f"/proc/self/fd/{self.dir_fd}/{SOCKET_NAME}")
        finally:
            os.umask(old)
        self.sock.listen(8)
        self.closed = False
        self.thread = threading.Thread(target=self._accept, name="control", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.closed = True
        try:
            os.unlink(SOCKET_NAME, dir_fd=self.dir_fd)
        except OSError:
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        os.close(self.dir_fd)

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="control-request", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            send = _sender(conn)
            try:
                if _peer_uid(conn) != os.getuid():
                    send({"ok": False, "kind": "failure", "error": "not the deployment's own user"})
                    return
                op, args = parse_request(_read_line(conn, REQUEST_READ_TIMEOUT))
            except (ValueError, OSError) as exc:
                send({"ok": False, "kind": "usage", "error": f"bad request: {exc}"})
                return
            if not self.busy.acquire(blocking=False):
                send(
                    {
                        "ok": False,
                        "kind": "failure",
                        "error": f"another change is in progress ({self.busy_with or 'starting'})",
                        "fix": "wait for it to end (`status` shows it), then run this again",
                    }
                )
                return
            try:  # the answer goes out after the lock is free: a client that asks again at once is served
                self.busy_with = describe(op, args)
                answer = self._run(op, args, send)
            finally:
                self.busy_with = None
                self.busy.release()
            send(answer)

    def _run(self, op: str, args: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        try:
            return {"ok": True, "result": self.handler(op, args, lambda text: send({"say": text}))}
        except UserError as exc:
            kind = next((k for k, t in ERROR_KINDS.items() if isinstance(exc, t)), "failure")
            return {"ok": False, "kind": kind, "error": str(exc), "fix": exc.fix}
        except Exception as exc:  # noqa: BLE001  a bug in a change must not take the supervisor down
            error = f"the change failed: {exc}" if str(exc) else "the change failed"
            return {"ok": False, "kind": "failure", "error": error}


def describe(op: str, args: dict[str, Any]) -> str:
    """The change in progress as `status` and a refused client see it: `restart prefill-0`."""
    target = args.get("role" if op in ("add", "scale") else "instance")
    if op == "adopt":
        return "up of an edited file"
    return f"{op} {target}" if isinstance(target, str) else op


def parse_request(line: bytes) -> tuple[str, dict[str, Any]]:
    data = json.loads(line)
    if not isinstance(data, dict) or not isinstance(data.get("op"), str) or data["op"] not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}")
    args = data.get("args", {})
    if not isinstance(args, dict) or len(args) > 16:
        raise ValueError("args must be an object")
    for key, value in args.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool) or value is None:
            raise ValueError(f"argument {key!r} must be a string, number or boolean")
        if isinstance(value, str) and (len(value) > MAX_VALUE or any(ord(c) < 32 for c in value)):
            raise ValueError(f"argument {key!r} is too long or holds a control character")
    return data["op"], args


def _sender(conn: socket.socket) -> Callable[[dict[str, Any]], None]:
    lock = threading.Lock()
    gone = []

    def send(message: dict[str, Any]) -> None:
        if gone:
            return
        data = json.dumps(message).encode()[: MAX_LINE - 1] + b"\n"
        with lock:
            try:
                conn.sendall(data)
            except OSError:
                gone.append(True)  # the client went away: the change goes on

    return send


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _read_line(conn: socket.socket, timeout: float | None) -> bytes:
    conn.settimeout(timeout)
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            if data:
                break
            raise ValueError("the other end closed without a line")
        data += chunk
        if len(data) > MAX_LINE:
            raise ValueError(f"a line longer than {MAX_LINE} bytes")
    return data.split(b"\n", 1)[0]


def request(
    run_dir: RunDir, op: str, args: dict[str, Any], say: Callable[[str], None], timeout: float = 3600.0
) -> dict[str, Any]:
    """Ask the deployment's supervisor for one change; `say` gets its progress lines. Raises the
    UserError it answered with, or RuntimeFailure when no supervisor listens."""
    no_one = RuntimeFailure(
        f"deployment {run_dir.name!r}: no supervisor answers on {run_dir.path / SOCKET_NAME}",
        fix=f"`muse-launch status {run_dir.name}` says whether its supervisor still runs; "
        f"without one, `muse-launch down {run_dir.name}` and `up` it again",
    )
    try:
        dir_fd = os.open(run_dir.path, os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise no_one from None
    try:
        try:
            st = os.stat(SOCKET_NAME, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            raise no_one from None
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
            raise RuntimeFailure(
                f"{run_dir.path / SOCKET_NAME} is not the supervisor's socket (not a socket of this user)",
                fix=f"remove it; `muse-launch down {run_dir.name}` and `up` make a fresh one",
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as conn:
            try:
                conn.connect(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
            except OSError:
                raise no_one from None
            conn.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
            return _answers(conn, say, timeout, no_one)
    finally:
        os.close(dir_fd)


def _answers(
    conn: socket.socket, say: Callable[[str], None], timeout: float, no_one: RuntimeFailure
) -> dict[str, Any]:
    conn.settimeout(timeout)
    reader = conn.makefile("rb")
    for _ in range(MAX_ANSWER_LINES):
        line = reader.readline(MAX_LINE)
        if not line:
            raise RuntimeFailure(
                "the supervisor went away before it answered",
                fix=no_one.fix,
            )
        try:
            message = json.loads(line)
        except ValueError:
            raise RuntimeFailure("the supervisor answered something that is not JSON") from None
        if not isinstance(message, dict):
            continue
        if isinstance(message.get("say"), str):
            say(message["say"])
        elif message.get("ok") is True and isinstance(message.get("result", {}), dict):
            return message.get("result", {})
        elif message.get("ok") is False:
            error = message.get("error")
            fix = message.get("fix")
            kind = ERROR_KINDS.get(message.get("kind"), RuntimeFailure)
            raise kind(
                str(error) if isinstance(error, str) else "refused",
                fix=fix if isinstance(fix, str) else None,
            )
    raise RuntimeFailure("the supervisor's answer has no end")
