"""Wiring between simulated processes: the retry helpers every peer connection shares, and
the multi-node rendezvous (node 0 listens on the dist-init address, the other nodes join it;
none is ready before all have)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from .server import SimEngine

PEER_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


def hostport(host: str, port: Any) -> str:
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def backoff(attempt: int) -> float:
    """Retry gaps for wiring: quick at first (peers usually come up together), then 1 s."""
    return min(0.1 * (2 ** max(attempt - 1, 0)), 1.0)


def err_text(text: str) -> str:
    """The message inside a peer's error body (JSON or plain), at most 300 characters."""
    try:
        j = json.loads(text)
        if isinstance(j, dict):
            e = j.get("error", j.get("message", j))
            if isinstance(e, dict):
                e = e.get("message", e)
            return str(e)[:300]
    except ValueError:
        pass
    return text[:300]


async def read_json(request: web.Request) -> dict:
    """The request's JSON object; anything else reads as {}."""
    try:
        body = await request.json()
        return body if isinstance(body, dict) else {}
    except ValueError:
        return {}


class RetryLog:
    """Retry logs: every change of the problem, then every 10th attempt."""

    def __init__(self) -> None:
        self._last: dict[tuple, str | None] = {}

    def should_log(self, key: tuple, problem: str | None, attempt: int) -> bool:
        last = self._last.get(key)
        self._last[key] = problem
        return problem != last or attempt % 10 == 0


class DistInit:
    """Multi-node: node 0 serves ``/join`` on the dist-init address; nodes > 0 join it."""

    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.cfg = engine.cfg
        self.joined: set[int] = set()
        self.pending = self.cfg.nnodes > 1 and self.cfg.dist_init is not None

    def blockers(self) -> list[str]:
        c = self.cfg
        if not self.pending:
            return []
        if c.node_rank == 0:
            return [
                f"waiting for {c.nnodes - 1 - len(self.joined)} node(s) to join dist-init {c.dist_init_addr}"
            ]
        return [f"not yet joined dist-init {c.dist_init_addr}"]

    async def join(self) -> None:
        """Node rank > 0: join node 0, retrying until it answers."""
        c, e = self.cfg, self.engine
        host, port = c.dist_init
        url = f"http://{hostport(host, port)}/join"
        n = 0
        while self.pending:
            n += 1
            try:
                async with e.session.post(
                    url,
                    json={"node_rank": c.node_rank, "nnodes": c.nnodes, "model": c.model},
                    timeout=aiohttp.ClientTimeout(total=3),
                ) as r:
                    text = await r.text()
                    if r.status == 200:
                        self.pending = False
                        e.log(f"joined dist-init {c.dist_init_addr} as node {c.node_rank}")
                        return
                    problem = f"answered {r.status}: {err_text(text)}"
            except PEER_ERRORS as exc:
                problem = f"unreachable ({type(exc).__name__}: {exc})"
            if e.retries.should_log(("dist",), problem, n):
                e.log(f"dist-init {c.dist_init_addr} {problem}; retrying (attempt {n})")
            await asyncio.sleep(backoff(n))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/join", self._h_join)
        return app

    async def _h_join(self, request: web.Request) -> web.Response:
        c = self.cfg
        body = await read_json(request)
        rank, nnodes = body.get("node_rank"), body.get("nnodes")
        if nnodes != c.nnodes or body.get("model") != c.model:
            return web.json_response(
                {
                    "error": f"node {rank} disagrees: nnodes={nnodes} "
                    f"model={body.get('model')} (node 0 has nnodes="
                    f"{c.nnodes} model={c.model})"
                },
                status=409,
            )
        if not isinstance(rank, int) or not 0 < rank < c.nnodes:
            return web.json_response({"error": f"bad node_rank {rank}"}, status=409)
        self.joined.add(rank)
        self.engine.log(f"dist-init: node {rank} joined ({len(self.joined)}/{c.nnodes - 1})")
        if len(self.joined) >= c.nnodes - 1:
            self.pending = False
        return web.json_response({"status": "ok"})
