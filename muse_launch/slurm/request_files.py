"""`scale` and `restart` on SLURM: the command may run on another host than the batch host (a login node),
so it reaches the supervisor through files in the shared run directory, not a socket.

    slurm/changes/ID.request   the command's request, written atomically: {"op": ..., "args": {...}}
    slurm/changes/ID.answer    the supervisor's answer so far, rewritten atomically line by line: the lines
                               of the control socket's protocol (supervise/control_socket.py), `{"say":
                               ...}` as the
                               change goes, then `{"ok": true, "result": ...}` or `{"ok": false, ...}`

The batch host's watcher takes each request (a regular file of its own user, no link followed, bounded,
parsed by the control protocol's own checks), removes it, and hands it to the supervisor's control socket
on the batch host (supervise/control_socket.py: one change at a time, the others answered that one is in
progress).
The
command reads the answer back the same way (bounded, no link followed, each line's type checked) until its
last line, the supervisor's heartbeat stops, or the job signs off.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from muse_launch.errors import RuntimeFailure, UserError
from muse_launch.files import PlantedLink, read_nofollow
from muse_launch.supervise import control_socket as control

from .files import SlurmFiles

REQUEST = re.compile(r"[0-9a-f]{16}\.request")
MAX_REQUEST = 64 << 10
MAX_ANSWER_LINES = 2000  # progress lines past it are dropped; the last line always comes
MAX_ANSWER = MAX_ANSWER_LINES * 4200 + control.MAX_LINE
MAX_TAKEN_PER_POLL = 8
ANSWER_POLL = 0.1


class FileDesk:
    """The batch host's end: `poll()` (from the watcher thread) takes new requests; each is relayed to the
    control socket in a thread of its own."""

    def __init__(self, files: SlurmFiles):
        self.files = files
        self.open = False  # while the supervisor serves changes (once ready, until it stops)

    def poll(self) -> None:
        directory = self.files.changes
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return  # a link or someone else's: never read through
        names = sorted(n for n in os.listdir(directory) if REQUEST.fullmatch(n))[:MAX_TAKEN_PER_POLL]
        for name in names:
            path = directory / name
            answer = path.with_suffix(".answer")
            try:
                taken = _take(path, self.files.run_dir.home)
            except ValueError as exc:
                _Answer(self.files, answer).send(
                    {"ok": False, "kind": "usage", "error": f"bad request: {exc}"}
                )
                continue
            if taken is not None:
                threading.Thread(target=self._relay, args=(taken, answer), daemon=True).start()

    def _relay(self, request: tuple[str, dict[str, Any]], answer_path) -> None:
        answer = _Answer(self.files, answer_path)
        op, args = request
        try:
            result = control.request(self.files.run_dir, op, args, lambda text: answer.send({"say": text}))
            answer.send({"ok": True, "result": result})
        except UserError as exc:
            kind = next((k for k, t in control.ERROR_KINDS.items() if isinstance(exc, t)), "failure")
            answer.send({"ok": False, "kind": kind, "error": str(exc), "fix": exc.fix})
        except Exception as exc:  # noqa: BLE001  the watcher goes on whatever one change did
            answer.send({"ok": False, "kind": "failure", "error": f"{type(exc).__name__}: {exc}"})


def _take(path, root) -> tuple[str, dict[str, Any]] | None:
    """The request, removed; None where it is not a regular file of this user (it is removed unread)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        path.unlink(missing_ok=True)
        return None
    try:
        data = read_nofollow(path, root=root, limit=MAX_REQUEST + 1)
    except (OSError, PlantedLink):
        path.unlink(missing_ok=True)
        return None
    path.unlink(missing_ok=True)
    if len(data) > MAX_REQUEST:
        raise ValueError(f"longer than {MAX_REQUEST} bytes")
    return control.parse_request(data.strip() or b"null")


class _Answer:
    def __init__(self, files: SlurmFiles, path):
        self.files, self.path = files, path
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message)[: control.MAX_LINE - 1]
        with self.lock:
            if "say" in message and len(self.lines) >= MAX_ANSWER_LINES:
                return
            self.lines.append(line)
            try:
                self.files.write_text(self.path, "\n".join(self.lines) + "\n")
            except OSError:
                pass  # the command sees the heartbeat go on and waits; the change goes on


def request(
    files: SlurmFiles, op: str, args: dict[str, Any], say: Callable[[str], None], timeout: float = 3600.0
) -> dict[str, Any]:
    """Ask the batch host's supervisor for one change; `say` gets its progress lines. Raises the UserError
    it answered with, or RuntimeFailure when no supervisor beats."""
    name = files.run_dir.name
    gone = RuntimeFailure(
        f"deployment {name!r}: no supervisor runs on its SLURM job's batch host (no heartbeat in "
        f"{files.heartbeat})",
        fix=f"`muse-launch status {name}` says what is left; `muse-launch down {name}` and `up` it again",
    )
    if not files.supervisor_alive():
        raise gone
    ident = secrets.token_hex(8)
    req, answer = files.changes / f"{ident}.request", files.changes / f"{ident}.answer"
    files.write_text(req, json.dumps({"op": op, "args": args}) + "\n")
    try:
        return _await_answer(files, answer, say, timeout, gone)
    finally:
        req.unlink(missing_ok=True)
        answer.unlink(missing_ok=True)


def _await_answer(files: SlurmFiles, answer, say, timeout: float, gone: RuntimeFailure) -> dict[str, Any]:
    seen = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            data = read_nofollow(answer, root=files.run_dir.home, limit=MAX_ANSWER + 1)
        except FileNotFoundError:
            data = b""
        except PlantedLink as exc:
            raise RuntimeFailure(str(exc), fix=exc.fix) from None
        if len(data) > MAX_ANSWER:
            raise RuntimeFailure("the supervisor's answer is longer than any it writes")
        lines = data.split(b"\n")[:-1]  # the last piece is incomplete (or empty)
        for line in lines[seen:]:
            seen += 1
            if (end := _message(line, say)) is not None:
                return end
        if not files.supervisor_alive() or files.done.exists():
            raise RuntimeFailure("the supervisor went away before it answered", fix=gone.fix)
        time.sleep(ANSWER_POLL)
    raise RuntimeFailure(f"no answer from the supervisor in {timeout:g}s")


def _message(line: bytes, say: Callable[[str], None]) -> dict[str, Any] | None:
    """A progress line said (None), or the end: the result, or the error raised."""
    try:
        message = json.loads(line)
    except ValueError:
        raise RuntimeFailure("the supervisor answered something that is not JSON") from None
    if not isinstance(message, dict):
        return None
    if isinstance(message.get("say"), str):
        say(message["say"])
    elif message.get("ok") is True and isinstance(message.get("result", {}), dict):
        return message.get("result", {})
    elif message.get("ok") is False:
        error, fix = message.get("error"), message.get("fix")
        kind = control.ERROR_KINDS.get(message.get("kind"), RuntimeFailure)
        raise kind(
            str(error) if isinstance(error, str) else "refused", fix=fix if isinstance(fix, str) else None
        )
    return None
