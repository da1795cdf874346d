"""`muse-launch ARGS` inside the test process: the CLI's own entry (cli.run), its output captured.

A subprocess costs the interpreter's start and every import again (~0.3 s, 1.3 s on a loaded
machine); tests of parsing and output call this instead. What only a real process shows (the
exit status the shell sees, nothing printed past the error table) stays in test_cli.py.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Ran:
    """The parts of subprocess.CompletedProcess the tests read."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _environment(env: Mapping[str, str] | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def muse(
    *args: Any,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = REPO,
    internal_ok: bool = False,
) -> Ran:
    """Run the CLI in this process: `env` replaces the environment for the call (as subprocess's
    env= does), `cwd` is the directory relative paths are read from (the repository by default).
    An internal error (exit 70) fails the test with its traceback, unless `internal_ok`."""
    from muse_launch.cli import run

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with (
        _environment(env),
        contextlib.chdir(cwd or os.getcwd()),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        code = run(argv)
    if code == 70 and not internal_ok:
        with (
            _environment({**os.environ, "MUSE_LAUNCH_DEBUG": "1"}),
            contextlib.redirect_stderr(io.StringIO()) as tb,
            contextlib.chdir(cwd or os.getcwd()),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            run(argv)  # again, for the traceback
        raise AssertionError(f"muse-launch {' '.join(argv)}: internal error\n{tb.getvalue()}")
    return Ran(["muse-launch", *argv], code, out.getvalue(), err.getvalue())
