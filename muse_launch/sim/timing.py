"""The simulated engine's clock and batch: how long a request takes, and what it counts.

A rehearsal benchmark needs the shape of a real engine, not its speed:

* prefill: ``prompt tokens / prefill_tokens_per_s`` seconds, one prompt at a time (a real
  engine's prefill is compute-bound: prompts that arrive together wait for each other, so the
  time to first token grows with the load);
* decode: every token after the first takes ``itl + itl_per_running x (running - 1)`` seconds,
  the running batch read at each step (a bigger batch makes each step slower);
* at most ``max_running`` requests run at once; the others wait, counted as queued.

A request counts as running from its admission until its last token is written (SGLang and vLLM
count it so until the stream ends), which is what a drain waits on. :class:`Counters` is the one
object the engine's metrics read (``running``, ``queued``, token totals).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

DEFAULT_PREFILL_TOKENS_PER_S = 50000.0
DEFAULT_ITL_S = 0.002
DEFAULT_ITL_PER_RUNNING_S = 0.00005
DEFAULT_MAX_RUNNING = 256


@dataclass(frozen=True)
class Rates:
    prefill_tokens_per_s: float = DEFAULT_PREFILL_TOKENS_PER_S
    itl_s: float = DEFAULT_ITL_S
    itl_per_running_s: float = DEFAULT_ITL_PER_RUNNING_S
    max_running: int = DEFAULT_MAX_RUNNING

    def prefill_s(self, tokens: int) -> float:
        return max(tokens, 0) / self.prefill_tokens_per_s if self.prefill_tokens_per_s > 0 else 0.0

    def step_s(self, running: int) -> float:
        """One decode step's time with `running` requests in the batch."""
        return self.itl_s + self.itl_per_running_s * max(running - 1, 0)


@dataclass
class Counters:
    """What the engine reports about its load: read by /metrics, /v1/loads, /get_load and /server_info."""

    running: int = 0  # admitted, until the last token is written
    queued: int = 0  # waiting for room in the running batch
    requests_total: int = 0  # requests admitted since start
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0  # tokens written to clients (a prefill's one token included)


class Batch:
    """The running batch: admission, prefill and decode steps, and the counters they move."""

    def __init__(self, rates: Rates | None = None) -> None:
        self.rates = rates or Rates()
        self.counters = Counters()
        self._room: asyncio.Semaphore | None = None  # made in the serving loop
        self._prefill: asyncio.Lock | None = None
        self.on_step: Callable[[float], None] = lambda seconds: None  # each token's gap (the ITL histogram)

    @asynccontextmanager
    async def admitted(self, prompt_tokens: int = 0) -> AsyncIterator[None]:
        """Queued until the batch has room, then running until the block ends (the last token)."""
        if self._room is None:
            self._room = asyncio.Semaphore(max(self.rates.max_running, 1))
        c = self.counters
        c.queued += 1
        try:
            await self._room.acquire()
        finally:
            c.queued -= 1
        c.running += 1
        c.requests_total += 1
        c.prompt_tokens_total += max(prompt_tokens, 0)
        try:
            yield
        finally:
            c.running -= 1
            self._room.release()

    def count_prompt(self, tokens: int) -> None:
        """Prompt tokens known only once admitted (the body is read inside the batch)."""
        self.counters.prompt_tokens_total += max(tokens, 0)

    async def prefill(self, tokens: int) -> None:
        if self._prefill is None:
            self._prefill = asyncio.Lock()
        seconds = self.rates.prefill_s(tokens)
        if seconds <= 0:
            return
        async with self._prefill:
            await asyncio.sleep(seconds)

    async def step(self) -> None:
        """One decode step of this request, as long as the batch makes it now."""
        seconds = self.rates.step_s(self.counters.running)
        started = time.monotonic()
        if seconds > 0:
            await asyncio.sleep(seconds)
        self.on_step(time.monotonic() - started)

    async def health_generation(self) -> None:
        """SGLang's /health: a one-token generation through the scheduler, not counted in the metrics. It
        waits behind a prefill in progress and takes one decode step; it needs no room in the batch (SGLang
        answers as soon as the scheduler gives any output)."""
        if self._prefill is None:
            self._prefill = asyncio.Lock()
        async with self._prefill:
            pass
        seconds = self.rates.step_s(self.counters.running)
        if seconds > 0:
            await asyncio.sleep(seconds)

    def emitted(self, tokens: int = 1) -> None:
        self.counters.generation_tokens_total += max(tokens, 0)
