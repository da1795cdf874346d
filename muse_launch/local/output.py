"""Output that never holds up the supervisor: a foreground `up` piped into a slow reader blocks
in write(2) once the pipe is full, and a loop that printed there itself would stop supervising.

A thread of its own does the writing. `write` only queues a line (state changes: a few per
event); role logs are read by that thread straight from their files (`follow`), so a reader that
falls behind sees them later, and nothing piles up in memory. A reader that goes away (EPIPE)
ends the output, not the deployment.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

FOLLOW_SECONDS = 0.25  # how often new role log lines are printed


class BackgroundWriter:
    """A file-like object for rich's Console and the progress printers: write() returns at once."""

    def __init__(self, out: TextIO):
        self.out = out
        self._pending: deque[str] = deque()
        self._follow: Callable[[], None] | None = None
        self._wake = threading.Event()  # set from the main thread only, never from a signal handler
        self._closing = False
        self.broken = False  # the reader went away
        self._thread = threading.Thread(target=self._run, name="output", daemon=True)
        self._thread.start()

    def write(self, text: str) -> int:
        if not self.broken:
            self._pending.append(text)
            self._wake.set()
        return len(text)

    def flush(self) -> None:
        self._wake.set()

    def isatty(self) -> bool:
        return self.out.isatty()

    def follow(self, print_new: Callable[[], None]) -> None:
        """Call `print_new` (which writes to the real stream) from the writer's thread, every little while."""
        self._follow = print_new
        self._wake.set()

    def close(self) -> None:
        """Write out what is queued (this may wait for the reader: supervision is over by now), then stop."""
        self._closing = True
        self._wake.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self._wake.wait(FOLLOW_SECONDS)
            self._wake.clear()
            closing = self._closing  # read before draining: whatever was queued before close() goes out
            try:
                while self._pending:
                    self.out.write(self._pending.popleft())
                if self._follow is not None:
                    self._follow()
                self.out.flush()
            except (BrokenPipeError, OSError, ValueError):  # the reader left, or the stream was closed
                self.broken = True
                self._pending.clear()
                return
            if closing:
                return


class LogWriter:
    """The detached supervisor's supervisor.log, written straight to its descriptor, a line at a time: on a
    full or failing disk the line is lost, the supervisor is not (nothing is buffered to fail later)."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, text: str) -> int:
        try:
            os.write(self.fd, text.encode(errors="replace"))
        except OSError:
            pass
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False
