"""KV hand-off between simulated prefill and decode servers, over real sockets.

SGLang (``--disaggregation-mode``): the prefill runs a KV bootstrap HTTP server on
``--disaggregation-bootstrap-port``.  For each request (carrying ``bootstrap_host``,
``bootstrap_port``, ``bootstrap_room`` from the router) the prefill registers the room and
holds its response until a decode has fetched it; the decode connects to
``bootstrap_host:bootstrap_port`` and long-polls ``GET /kv/{room}``.

vLLM (``--kv-transfer-config``):
  * NixlConnector - every instance listens on the side channel
    (``VLLM_NIXL_SIDE_CHANNEL_HOST``:``VLLM_NIXL_SIDE_CHANNEL_PORT``, vLLM's defaults
    when unset); the prefill's response carries ``kv_transfer_params`` naming it and the
    decode reads the blocks from there (``GET /nixl/handshake``, ``GET /nixl/read/{id}``).
  * MooncakeConnector - the prefill listens on ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` and
    answers ``GET /query`` (engine id per DP rank, what vllm-router asks at start-up); the
    decode gets ``remote_bootstrap_addr`` + ``transfer_id`` and fetches ``/kv/{transfer_id}``.
  * ExampleConnector - the prefill writes the prompt's KV record under
    ``shared_storage_path``; the decode looks it up there (a miss means local recompute,
    exactly as the real connector behaves).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .wiring import hostport


class KVTransferError(Exception):
    """The decode could not obtain the prefill's KV cache: the request fails (HTTP 500)."""


@dataclass
class Slot:
    info: dict[str, Any] | None = None
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    fetched: asyncio.Event = field(default_factory=asyncio.Event)
    created: float = field(default_factory=time.monotonic)
    fetched_by: str | None = None


class SlotTable:
    """Rooms (SGLang) or transfer ids (vLLM) a prefill holds for a decode to fetch."""

    def __init__(self, max_age: float = 600.0, max_slots: int = 10000):
        self.slots: dict[str, Slot] = {}
        self.max_age = max_age
        self.max_slots = max_slots

    def _gc(self) -> None:
        if len(self.slots) < self.max_slots // 2:
            return
        now = time.monotonic()
        for k in [k for k, s in self.slots.items() if now - s.created > self.max_age]:
            self.slots.pop(k, None)
        while len(self.slots) >= self.max_slots:
            self.slots.pop(next(iter(self.slots)))

    def register(self, key: str, info: dict[str, Any]) -> Slot:
        self._gc()
        slot = self.slots.get(key)
        if slot is not None and slot.info is not None:
            raise KVTransferError(f"key {key} is already registered")
        if slot is None:
            slot = self.slots[key] = Slot()
        slot.info = info
        slot.registered.set()
        return slot

    async def wait_fetch(self, key: str, timeout: float, who: str) -> Slot | None:
        slot = self.slots.get(key)
        if slot is None:
            self._gc()
            slot = self.slots[key] = Slot()
        try:
            await asyncio.wait_for(slot.registered.wait(), timeout)
        except TimeoutError:
            if slot.info is None and self.slots.get(key) is slot:
                self.slots.pop(key, None)
            return None
        slot.fetched_by = who
        slot.fetched.set()
        return slot

    def drop(self, key: str) -> None:
        self.slots.pop(key, None)


def compat_problems(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """Mismatches that make a real KV transfer impossible (both sides must agree)."""
    probs = []
    if mine.get("model") and theirs.get("model") and mine["model"] != theirs["model"]:
        probs.append(f"model differs (prefill {theirs['model']!r}, decode {mine['model']!r})")
    for key, label in (("transfer_backend", "transfer backend"), ("kv_connector", "KV connector")):
        if mine.get(key) and theirs.get(key) and mine[key] != theirs[key]:
            probs.append(f"{label} differs (prefill {theirs[key]}, decode {mine[key]})")
    a, b = mine.get("kv_cache_dtype"), theirs.get("kv_cache_dtype")
    if a and b and "auto" not in (a, b) and a != b:
        probs.append(f"KV-cache dtype differs (prefill {b}, decode {a})")
    a, b = mine.get("page_size"), theirs.get("page_size")
    if a and b and a != b:
        probs.append(f"page size differs (prefill {b}, decode {a})")
    return probs


# ----------------------------------------------------------------- bootstrap-side apps


def sglang_bootstrap_app(engine) -> web.Application:
    """The prefill's KV bootstrap server (SGLang's is an HTTP server too)."""
    app = web.Application()

    async def route(request: web.Request) -> web.Response:
        return web.json_response(
            engine.kv_identity()
            | {
                "prefill_attn_tp_size": engine.cfg.tp_size,
                "prefill_dp_size": engine.cfg.dp_size,
                "prefill_pp_size": engine.cfg.pp_size,
                "prefill_page_size": engine.cfg.page_size or 1,
            }
        )

    async def kv(request: web.Request) -> web.Response:
        room = request.match_info["room"]
        timeout = min(float(request.query.get("timeout", engine.kv_timeout)), 60.0)
        peer = request.remote or "?"
        slot = await engine.slots.wait_fetch(room, timeout, peer)
        if slot is None:
            engine.log(
                f"bootstrap: decode {peer} asked for bootstrap_room {room}, never "
                f"registered within {timeout:.1f}s"
            )
            return web.json_response(
                {"error": f"bootstrap_room {room} is not registered on this prefill (waited {timeout:.1f}s)"},
                status=404,
            )
        engine.log(
            f"bootstrap: bootstrap_room {room} fetched by decode {peer} "
            f"({slot.info.get('prompt_tokens')} prompt tokens)"
        )
        return web.json_response(slot.info)

    app.router.add_get("/route", route)
    app.router.add_get("/kv/{room}", kv)

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app.router.add_get("/health", health)
    return app


def nixl_side_channel_app(engine) -> web.Application:
    app = web.Application()

    async def handshake(request: web.Request) -> web.Response:
        engine.log(f"nixl: handshake from {request.remote}")
        return web.json_response(engine.kv_identity())

    async def read(request: web.Request) -> web.Response:
        rid = request.match_info["rid"]
        timeout = min(float(request.query.get("timeout", engine.kv_timeout)), 60.0)
        slot = await engine.slots.wait_fetch(rid, timeout, request.remote or "?")
        if slot is None:
            return web.json_response({"error": f"no KV blocks held for request {rid}"}, status=404)
        engine.slots.drop(rid)  # blocks are freed once read
        engine.log(
            f"nixl: KV blocks of request {rid} read by {request.remote} "
            f"({slot.info.get('prompt_tokens')} prompt tokens)"
        )
        return web.json_response(slot.info)

    app.router.add_get("/nixl/handshake", handshake)
    app.router.add_get("/nixl/read/{rid}", read)
    return app


def mooncake_bootstrap_app(engine) -> web.Application:
    app = web.Application()

    async def query(request: web.Request) -> web.Response:
        engine.log(f"mooncake: bootstrap /query from {request.remote}")
        return web.json_response(
            {
                str(r): {"engine_id": engine.engine_id, "dp_rank": r, "tp_size": engine.cfg.tp_size}
                for r in range(max(engine.cfg.dp_size, 1))
            }
        )

    async def kv(request: web.Request) -> web.Response:
        tid = request.match_info["tid"]
        timeout = min(float(request.query.get("timeout", engine.kv_timeout)), 60.0)
        slot = await engine.slots.wait_fetch(tid, timeout, request.remote or "?")
        if slot is None:
            return web.json_response(
                {"error": f"transfer {tid} is not registered on this prefill (waited {timeout:.1f}s)"},
                status=404,
            )
        engine.slots.drop(tid)
        engine.log(
            f"mooncake: transfer {tid} fetched by {request.remote} "
            f"({slot.info.get('prompt_tokens')} prompt tokens)"
        )
        return web.json_response(slot.info)

    app.router.add_get("/query", query)
    app.router.add_get("/kv/{tid}", kv)
    return app


# ----------------------------------------------------------------- decode-side fetches


async def _get_json(session, url: str, timeout: float, what: str) -> dict:
    import aiohttp

    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            try:
                body = await r.json(content_type=None)
            except (ValueError, aiohttp.ContentTypeError):
                body = {"error": (await r.text())[:200]}
            if r.status != 200:
                raise KVTransferError(f"{what} answered {r.status}: {(body or {}).get('error', body)}")
            return body
    except KVTransferError:
        raise
    except TimeoutError:
        raise KVTransferError(f"{what} did not answer within {timeout:.1f}s") from None
    except aiohttp.ClientConnectorError as e:
        reason = os.strerror(e.errno).lower() if e.errno else str(e)
        raise KVTransferError(f"cannot connect to {what}: {reason}") from None
    except aiohttp.ClientError as e:
        raise KVTransferError(f"cannot connect to {what}: {e}") from None


async def sglang_fetch(engine, host: str, port: int, room: Any, prompt_tokens: int) -> dict:
    addr = f"{host}:{port}"
    what = f"the prefill's KV bootstrap server at {addr}"
    try:
        info = await _get_json(
            engine.session,
            f"http://{hostport(host, port)}/kv/{room}?timeout={engine.kv_timeout}",
            engine.kv_timeout + 2.0,
            what,
        )
    except KVTransferError as e:
        me = hostport(engine.cfg.advertised_host, engine.cfg.port)
        raise KVTransferError(
            f"KV transfer failed for bootstrap_room {room} (bootstrap "
            f"{addr}): decode {me} could not fetch the room: {e}"
        ) from None
    probs = compat_problems(engine.kv_identity(), info)
    if probs:
        raise KVTransferError(
            f"KV transfer failed for bootstrap_room {room} (bootstrap "
            f"{addr}): prefill and decode are incompatible: " + "; ".join(probs)
        )
    if info.get("prompt_tokens") not in (None, prompt_tokens):
        raise KVTransferError(
            f"KV transfer failed for bootstrap_room {room} (bootstrap "
            f"{addr}): the prefill computed {info.get('prompt_tokens')} "
            f"prompt tokens, this request has {prompt_tokens}"
        )
    return info


async def nixl_fetch(engine, params: dict) -> dict:
    host, port = params.get("remote_host"), params.get("remote_port")
    rid = params.get("remote_request_id") or params.get("remote_req_id")
    if not host or not port or not rid:
        raise KVTransferError(f"invalid kv_transfer_params for a remote prefill: {params}")
    addr = f"{host}:{port}"
    base = f"http://{hostport(host, port)}"
    what = f"the prefill's NIXL side channel at {addr}"
    try:
        meta = await _get_json(engine.session, f"{base}/nixl/handshake", 3.0, what)
        if params.get("remote_engine_id") and meta.get("engine_id") != params["remote_engine_id"]:
            raise KVTransferError(
                f"remote NIXL agent engine ID mismatch: expected "
                f"{params['remote_engine_id']}, got {meta.get('engine_id')}"
            )
        probs = compat_problems(engine.kv_identity(), meta)
        if probs:
            raise KVTransferError("prefill and decode are incompatible: " + "; ".join(probs))
        return await _get_json(
            engine.session,
            f"{base}/nixl/read/{rid}?timeout={engine.kv_timeout}",
            engine.kv_timeout + 2.0,
            what,
        )
    except KVTransferError as e:
        raise KVTransferError(
            f"KV transfer failed for request {rid} (NIXL side channel {addr}): {e}"
        ) from None


async def mooncake_fetch(engine, params: dict) -> dict:
    addr = params.get("remote_bootstrap_addr")
    tid = params.get("transfer_id")
    if not addr or not tid:
        raise KVTransferError(f"invalid kv_transfer_params for a remote prefill: {params}")
    addr = addr.rstrip("/")
    if "://" not in addr:
        addr = "http://" + addr
    what = f"the prefill's Mooncake bootstrap server at {addr}"
    try:
        ranks = await _get_json(engine.session, f"{addr}/query", 3.0, what)
        ids = {v.get("engine_id") for v in ranks.values() if isinstance(v, dict)}
        if params.get("remote_engine_id") and params["remote_engine_id"] not in ids:
            raise KVTransferError(
                f"remote engine id {params['remote_engine_id']} is not served there (it has {sorted(ids)})"
            )
        info = await _get_json(
            engine.session, f"{addr}/kv/{tid}?timeout={engine.kv_timeout}", engine.kv_timeout + 2.0, what
        )
    except KVTransferError as e:
        raise KVTransferError(
            f"KV transfer failed for transfer {tid} (Mooncake bootstrap {addr}): {e}"
        ) from None
    probs = compat_problems(engine.kv_identity(), info)
    if probs:
        raise KVTransferError(
            f"KV transfer failed for transfer {tid}: prefill and decode are incompatible: " + "; ".join(probs)
        )
    return info


# ----------------------------------------------------------------- ExampleConnector


def prompt_key(token_ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(token_ids).encode()).hexdigest()[:32]


def example_store(path: str, token_ids: list[int], info: dict, block_size: int) -> int:
    n = len(token_ids) // block_size * block_size
    if n == 0:
        return 0
    d = os.path.join(path, prompt_key(token_ids[:n]))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".kv.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(info | {"stored_tokens": n}, f)
    os.replace(tmp, os.path.join(d, "kv.json"))
    return n


def example_lookup(path: str, token_ids: list[int], block_size: int) -> dict | None:
    n = len(token_ids) // block_size * block_size
    if n == 0:
        return None
    f = os.path.join(path, prompt_key(token_ids[:n]), "kv.json")
    try:
        with open(f) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None
