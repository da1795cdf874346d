"""How a command reaches a running supervisor: a unix socket, `control.sock` in the run directory.

The supervisor owns the socket (it unlinks whatever has the name, binds a fresh one, and removes it when it
goes). A client is served only when it runs as the supervisor's own user (SO_PEERCRED). One request per
connection: a JSON object on one line, `{"op": ..., "args": {...}}`; the answer is JSON lines, `{"say":
TEXT}` as the change goes, then `{"ok": true, "result": {...}}` or `{"ok": false, "error": ..., "fix": ...}`.
Changes are serialized: while one runs, another request is answered at once that one is in progress. A
change made of several requests (a rolling restart, `up FILE`'s steps) first takes a lease (`hold`): until
it ends (`release`, or no request of it for LEASE_IDLE seconds: its client went away) only requests that
carry its token are served, so no other change slips in between two of its requests. What ends a lease
unreleased, or released without `commit`, is told to the handler (`release`, committed false): a file that
`up` had the supervisor adopt is dropped again.

Every wait is bounded and the channel recovers by itself: a request must arrive whole within
REQUEST_READ_TIMEOUT (however slowly it trickles in); it is answered `taken` at once and a beat goes out every
BEAT seconds while it runs, so a client gives up on a supervisor that took nothing, or went silent, within
seconds, and on any request after the deadline its kind allows; running out of file descriptors makes the
accept loop back off and go on, never end.

Both ends treat what they read as hostile: the run directory (the socket is opened through the directory's
descriptor, never through a link: it must be a socket of this user), and every line (bounded, parsed, each
field's type checked). A client that goes away does not stop a change half-way.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from muse_launch.bounded_json import load_bounded_json
from muse_launch.change import KINDS, Change, from_wire
from muse_launch.errors import NotSupported, RuntimeFailure, UsageError, UserError
from muse_launch.rundir.state import RunDir

SOCKET_NAME = "control.sock"
MAX_LINE = 64 << 10  # one line of an answer
MAX_REQUEST = 4 << 20  # a request: `adopt` carries the file's `${env:...}` values, each of any size up to it
MAX_DEPTH = 8  # a request nests 2 deep; deeper is refused before the parser recurses
MAX_ANSWER_LINES = 100_000
REQUEST_READ_TIMEOUT = 5.0  # the whole request, from the connection on: a client that trickles is dropped
OPS = (*KINDS, "hold", "release")  # the changes, and a lease's start and end
MAX_VALUE = 8192  # one string argument (a file's path, an instance's name)
BIG_VALUES = {"env": MAX_REQUEST, "sets": MAX_REQUEST}  # `adopt`'s values and --set values, as JSON
LEASE_IDLE = 60.0  # a lease with no request of it running ends this long after the last one ended
BEAT = 2.0  # while a request runs, the server says it is alive this often
TAKEN_TIMEOUT = 10.0  # a client waits this long for the supervisor to take its request
SILENCE_TIMEOUT = 30.0  # and this long for any line while it runs (a beat comes every BEAT seconds)
ACCEPT_BACKOFF = (0.05, 1.0)  # out of descriptors: accept again after this, doubling up to the most
# Whole-request deadlines on the client's side, by kind: a change waits for its instance to start and be
# ready (the supervisor bounds that by the role's probe timeout) and for one to drain (its drain timeout).
DEADLINES = {
    "hold": 30.0,
    "release": 60.0,
    "adopt": 600.0,
    "add": 3600.0,
    "remove": 900.0,
    "restart": 4500.0,
    "scale": 6 * 3600.0,  # many instances, each started and ready one after another
}
ERROR_KINDS = {"usage": UsageError, "not_supported": NotSupported, "failure": RuntimeFailure}


class Handler(Protocol):
    """The supervisor's side: makes one typed change, or settles a lease's outcome
    (supervise/change_executor.py)."""

    def handle(self, change: Change, leased: bool, say: Callable[[str], None]) -> dict[str, Any]: ...

    def settle(self, commit: bool, say: Callable[[str], None]) -> dict[str, Any]: ...


class ControlServer:
    """The supervisor's end: a thread accepts; each request, read back as a typed change (change.py
    `from_wire`), runs `handler.handle(change, leased, say)` in a thread of its own, one at a time; the end
    of a lease runs `handler.settle`. The handler raises a UserError to refuse."""

    def __init__(self, run_dir: RunDir, handler: Handler):
        self.run_dir = run_dir
        self.handler = handler
        self.busy_with: str | None = None  # the change that runs now, or holds the lease
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
        self.accept_failures = 0  # accepts that failed and were tried again (out of descriptors)
        self.mutex = threading.Lock()  # guards busy_with and lease; held for a moment, never over a change
        self.lease: _Lease | None = None
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
        backoff = ACCEPT_BACKOFF[0]
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError as exc:
                if self.closed or exc.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    return  # closed: the supervisor goes
                # out of descriptors or memory (EMFILE, ENFILE, ENOBUFS), or one connection that broke:
                # the pending connections wait in the backlog until there is room again
                self.accept_failures += 1
                time.sleep(backoff)
                backoff = min(ACCEPT_BACKOFF[1], backoff * 2)
                continue
            backoff = ACCEPT_BACKOFF[0]
            try:
                threading.Thread(
                    target=self._serve, args=(conn,), name="control-request", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had: that client is told to go away, the loop goes on
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            send = _sender(conn)
            try:
                if _peer_uid(conn) != os.getuid():
                    send({"ok": False, "kind": "failure", "error": "not the deployment's own user"})
                    return
                op, args = parse_request(_read_request(conn, time.monotonic() + REQUEST_READ_TIMEOUT))
            except (ValueError, OSError) as exc:
                send({"ok": False, "kind": "usage", "error": f"bad request: {exc}"})
                return
            send({"taken": True})
            refusal, lease = self._claim(op, args)
            if refusal:
                send(refusal)
                return
            if op in ("hold", "release"):
                send(self._lease_op(op, args, lease, send))
                return
            beating = _Beat(send)
            try:  # the answer goes out after the lock is free: a client that asks again at once is served
                answer = self._run(op, args, send)
            finally:
                beating.stop()
                self._unclaim(lease)
            send(answer)

    def _claim(self, op: str, args: dict[str, Any]) -> tuple[dict[str, Any] | None, _Lease | None]:
        """Whether the request may run now: (a refusal, None), or (None, the lease it runs under)."""
        self._end_expired()
        with self.mutex:
            token = args.get("lease")
            if self.lease and token == self.lease.token:
                if self.lease.running:
                    return _refused("a request of this lease is already running"), None
                self.lease.running = True
                return None, self.lease
            if token is not None or op == "release":  # a stale lease: its change must not go on unheld
                ended = f"no such lease: it ended (none of its requests came for {LEASE_IDLE:g}s)"
                return _refused(ended), None
            if self.busy_with is not None:
                return _refused(f"another change is in progress ({self.busy_with})", busy=True), None
            self.busy_with = describe(op, args)
            if op == "hold":
                self.lease = _Lease(secrets.token_hex(16), self.busy_with)
                self.lease.running = True
                return None, self.lease
        return None, None

    def _end_expired(self) -> None:
        """A lease whose client went away ends unreleased: the handler is told its outcome does not stand."""
        with self.mutex:
            if not (self.lease and self.lease.expired(time.monotonic())):
                return
            self.lease, self.busy_with = None, "the end of an abandoned change"
        self._ended(committed=False)

    def _unclaim(self, lease: _Lease | None) -> None:
        with self.mutex:
            if lease is None:
                self.busy_with = None
            elif lease is self.lease:
                lease.running, lease.idle_since = False, time.monotonic()

    def _lease_op(self, op: str, args: dict[str, Any], lease: _Lease, send) -> dict[str, Any]:
        if op == "hold":
            self._unclaim(lease)
            return {"ok": True, "result": {"lease": lease.token}}
        with self.mutex:
            self.lease, self.busy_with = None, "the end of a change"
        return self._ended(committed=args.get("commit") is True, send=send)

    def _ended(self, committed: bool, send=lambda message: None) -> dict[str, Any]:
        """A lease is over (busy_with already says so): the handler is told whether its outcome stands."""
        try:
            return self._run("release", {"commit": committed}, send)
        finally:
            with self.mutex:
                self.busy_with = None

    def _run(self, op: str, args: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        def say(text: str) -> None:
            send({"say": text})

        try:
            if op == "release":
                return {"ok": True, "result": self.handler.settle(args.get("commit") is True, say)}
            leased = isinstance(args.get("lease"), str)
            return {"ok": True, "result": self.handler.handle(from_wire(op, args), leased, say)}
        except UserError as exc:
            kind = next((k for k, t in ERROR_KINDS.items() if isinstance(exc, t)), "failure")
            return {"ok": False, "kind": kind, "error": str(exc), "fix": exc.fix}
        except Exception as exc:  # noqa: BLE001  a bug in a change must not take the supervisor down
            error = f"the change failed: {exc}" if str(exc) else "the change failed"
            return {"ok": False, "kind": "failure", "error": error}


class _Lease:
    def __init__(self, token: str, what: str):
        self.token, self.what = token, what
        self.running = False
        self.idle_since = time.monotonic()

    def expired(self, now: float) -> bool:
        return not self.running and now - self.idle_since > LEASE_IDLE


class _Beat:
    """`{"beat": true}` every BEAT seconds until stopped: the client knows the supervisor still works."""

    def __init__(self, send: Callable[[dict[str, Any]], None]):
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, args=(send,), name="control-beat", daemon=True)
        self.thread.start()

    def _beat(self, send: Callable[[dict[str, Any]], None]) -> None:
        while not self.done.wait(BEAT):
            send({"beat": True})

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def _refused(error: str, busy: bool = False) -> dict[str, Any]:
    fix = "wait for it to end (`status` shows it), then run this again" if busy else None
    return {"ok": False, "kind": "failure", "error": error, "fix": fix}


def describe(op: str, args: dict[str, Any]) -> str:
    """The change in progress as `status` and a refused client see it: `restart prefill-0`."""
    if op == "hold":
        what = args.get("what")
        return what if isinstance(what, str) and what else "a change of several steps"
    if op == "adopt":
        return "up of an edited file"
    target = args.get("role" if op in ("add", "scale") else "instance")
    return f"{op} {target}" if isinstance(target, str) else op


def parse_request(line: bytes) -> tuple[str, dict[str, Any]]:
    data = load_bounded_json(line, MAX_REQUEST, MAX_DEPTH)  # a ValueError for one too deep, never a crash
    if not isinstance(data, dict) or not isinstance(data.get("op"), str) or data["op"] not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}")
    args = data.get("args", {})
    if not isinstance(args, dict) or len(args) > 16:
        raise ValueError("args must be an object")
    for key, value in args.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool) or value is None:
            raise ValueError(f"argument {key!r} must be a string, number or boolean")
        limit = BIG_VALUES.get(key, MAX_VALUE)
        if isinstance(value, str) and (len(value) > limit or any(ord(c) < 32 for c in value)):
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


def _read_request(conn: socket.socket, deadline: float) -> bytes:
    """One line, read whole by `deadline` however it trickles in, at most MAX_REQUEST bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError(f"not sent whole within {REQUEST_READ_TIMEOUT:g}s")
        conn.settimeout(left)
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            raise ValueError(f"not sent whole within {REQUEST_READ_TIMEOUT:g}s") from None
        if not chunk:
            if chunks:
                break
            raise ValueError("the other end closed without a line")
        chunks.append(chunk)
        size += len(chunk)
        if b"\n" in chunk:
            break
        if size > MAX_REQUEST:
            raise ValueError(f"a request longer than {MAX_REQUEST} bytes")
    line = b"".join(chunks).split(b"\n", 1)[0]
    if len(line) > MAX_REQUEST:
        raise ValueError(f"a request longer than {MAX_REQUEST} bytes")
    return line


def deadline_of(op: str, args: dict[str, Any]) -> float:
    """The seconds a request of this kind may take in all: its kind's, and its drain timeout on top."""
    drain = args.get("drain_timeout")
    extra = (
        float(drain) if isinstance(drain, int | float) and not isinstance(drain, bool) and drain > 0 else 0
    )
    return DEADLINES.get(op, 600.0) + min(extra, 86400.0)


def request(
    run_dir: RunDir,
    op: str,
    args: dict[str, Any],
    say: Callable[[str], None],
    timeout: float | None = None,
) -> dict[str, Any]:
    """Ask the deployment's supervisor for one change; `say` gets its progress lines. Raises the UserError
    it answered with, or RuntimeFailure when no supervisor listens, takes the request, or goes on answering
    (every wait is bounded: `timeout`, by default the request kind's deadline)."""
    no_one = RuntimeFailure(
        f"deployment {run_dir.name!r}: no supervisor answers on {run_dir.path / SOCKET_NAME}",
        fix=f"`muse-launch status {run_dir.name}` says whether its supervisor still runs; "
        f"without one, `muse-launch down {run_dir.name}` and `up` it again",
    )
    deadline = time.monotonic() + (timeout if timeout is not None else deadline_of(op, args))
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
            conn.settimeout(TAKEN_TIMEOUT)
            try:
                conn.connect(f"/proc/self/fd/{dir_fd}/{SOCKET_NAME}")
            except OSError:
                raise no_one from None
            try:
                conn.sendall(json.dumps({"op": op, "args": args}).encode() + b"\n")
            except OSError:  # it stopped reading: what it answered (a request too long) is read below
                conn.settimeout(TAKEN_TIMEOUT)
            return _answers(conn, say, deadline, no_one)
    finally:
        os.close(dir_fd)


def _answers(
    conn: socket.socket, say: Callable[[str], None], deadline: float, no_one: RuntimeFailure
) -> dict[str, Any]:
    reader = conn.makefile("rb")
    taken = False
    for _ in range(MAX_ANSWER_LINES):
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeFailure("the supervisor did not finish the request in time", fix=no_one.fix)
        conn.settimeout(min(left, SILENCE_TIMEOUT if taken else TAKEN_TIMEOUT))
        try:
            line = reader.readline(MAX_LINE)
        except TimeoutError:
            if not taken:
                raise RuntimeFailure(
                    f"the supervisor did not take the request within {TAKEN_TIMEOUT:g}s", fix=no_one.fix
                ) from None
            if time.monotonic() >= deadline:
                raise RuntimeFailure(
                    "the supervisor did not finish the request in time", fix=no_one.fix
                ) from None
            raise RuntimeFailure(
                f"the supervisor went silent for {SILENCE_TIMEOUT:g}s while it made the change",
                fix=no_one.fix,
            ) from None
        except OSError:
            line = b""
        if not line:
            raise RuntimeFailure(
                "the supervisor went away before it answered",
                fix=no_one.fix,
            )
        taken = True  # any line: `taken`, a beat, a progress line
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
