"""The unit tier starts no process: a unit test that runs a subprocess, forks or execs fails here, naming
what it started, so that "unit" stays seconds and never depends on the machine. Tests that start
processes belong in tests/integration."""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from muse_launch.host import versions

_EVENTS = ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system", "pty.spawn")
_IN_UNIT_TEST = [False]


class StartsAProcess(AssertionError):
    pass


def _audit(event: str, args: tuple) -> None:
    if _IN_UNIT_TEST[0] and event in _EVENTS:
        _IN_UNIT_TEST[0] = False  # raise once: the test's own cleanup may not be caught again
        shown = args[0] if args else ""
        raise StartsAProcess(
            f"a unit test started a process ({event} {shown!r}): move it to tests/integration"
        )


sys.addaudithook(_audit)


@pytest.fixture(autouse=True)
def _no_process_starts():
    _IN_UNIT_TEST[0] = True
    try:
        yield
    finally:
        _IN_UNIT_TEST[0] = False


def _query_here(python: str, tops) -> dict[str, tuple | None]:
    """The versions probe of this interpreter, answered in this process by the probe's own code (the product
    runs it in the engine's interpreter, a process of its own); other interpreters have nothing installed."""
    if Path(python).parent != Path(sys.executable).parent:
        return {t: None for t in tops}
    out = io.StringIO()
    argv = sys.argv
    sys.argv = ["-c", json.dumps({t: list(c) for t, c in tops.items()})]
    try:
        with contextlib.redirect_stdout(out):
            exec(versions._QUERY, {"__name__": "__query__"})
    finally:
        sys.argv = argv
    return {t: tuple(v) if v else None for t, v in json.loads(out.getvalue())["versions"].items()}


@pytest.fixture(autouse=True)
def _versions_in_process(monkeypatch):
    monkeypatch.setattr(versions, "query_interpreter", _query_here)
