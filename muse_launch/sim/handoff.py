"""A request's part of the disaggregated KV hand-off, on a prefill or a decode.

SGLang (``--disaggregation-mode``): the prefill registers the request's bootstrap room and
holds its answer until a decode fetched it; the decode fetches it from the prefill's bootstrap
server named in the request.  vLLM (``--kv-transfer-config``): the producer holds the KV for
the consumer named by ``kv_transfer_params`` (NIXL, Mooncake) or stores it in the shared
directory (ExampleConnector); the consumer loads it.  The sockets are in :mod:`.transfer`.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from . import transfer as tr
from .api import GenError
from .config import EXAMPLE, MOONCAKE, NIXL
from .wiring import hostport

if TYPE_CHECKING:
    from .server import SimEngine


class KVHandoff:
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine
        self.cfg = engine.cfg

    def computes_prefill(self, body: dict) -> bool:
        """Whether this server computes the prompt's KV itself: not a decode that receives it."""
        c = self.cfg
        if c.engine == "sglang":
            return c.disaggregation_mode != "decode"
        kvp = body.get("kv_transfer_params")
        remote = isinstance(kvp, dict) and bool(kvp.get("do_remote_prefill"))
        consumer_only = c.vllm_is_consumer and not c.vllm_is_producer
        return not (c.vllm_is_consumer and remote) and not (consumer_only and c.kv_connector == EXAMPLE)

    async def stage(self, body: dict, prompt_tokens: int, rid: str, token_ids: list[int]) -> dict[str, Any]:
        """Run this server's part of the disaggregated hand-off before answering.

        Returns extra response fields (vLLM kv_transfer_params) and the effective
        max_tokens override (prefill answers with one token)."""
        c, eng = self.cfg, self.engine
        if self.computes_prefill(body):  # before a prefill registers its room: the decode waits for it
            await eng.batch.prefill(prompt_tokens)
        if c.engine == "sglang" and c.disaggregation_mode in ("prefill", "decode"):
            return await self._sglang(body, prompt_tokens, rid)
        if c.engine != "vllm":
            return {}
        kvp = body.get("kv_transfer_params")
        conn = c.kv_connector
        if isinstance(kvp, dict) and kvp and not conn:
            self.engine.log(
                "warning: request carries kv_transfer_params but no "
                "--kv-transfer-config is set; they are ignored"
            )
        if not conn:
            return {"kv_transfer_params": None}
        kvp = kvp if isinstance(kvp, dict) else {}
        if conn == EXAMPLE:
            self._example_storage(kvp, prompt_tokens, token_ids)
            return {"kv_transfer_params": None}
        if kvp.get("do_remote_decode") and c.vllm_is_producer:
            return self._vllm_prefill(conn, kvp, prompt_tokens, rid)
        if kvp.get("do_remote_prefill") and c.vllm_is_consumer:
            await self._vllm_decode(conn, kvp, prompt_tokens)
        return {"kv_transfer_params": None}

    async def _sglang(self, body: dict, prompt_tokens: int, rid: str) -> dict[str, Any]:
        """SGLang PD: a prefill registers its bootstrap room and waits for the decode to fetch it."""
        c, eng = self.cfg, self.engine
        room = body.get("bootstrap_room")
        host = body.get("bootstrap_host")
        port = body.get("bootstrap_port")
        if room is None or host is None:
            raise GenError(
                400,
                f"this server runs with --disaggregation-mode "
                f"{c.disaggregation_mode}: requests need bootstrap_host, "
                f"bootstrap_port and bootstrap_room (send them through the "
                f"PD router)",
            )
        if c.transfer_backend == "fake":
            eng.log(f"kv: fake transfer backend, bootstrap_room {room} not transferred")
            return {"_max_tokens": 1} if c.disaggregation_mode == "prefill" else {}
        if c.disaggregation_mode == "prefill":
            key = str(room)
            try:
                slot = eng.slots.register(
                    key, eng.kv_identity() | {"room": room, "prompt_tokens": prompt_tokens, "rid": rid}
                )
            except tr.KVTransferError as e:
                raise GenError(500, f"bootstrap_room {room}: {e}") from None
            eng.log(
                f"bootstrap: bootstrap_room {room} registered ({prompt_tokens} "
                f"prompt tokens), waiting for the decode"
            )
            try:
                await asyncio.wait_for(slot.fetched.wait(), eng.kv_timeout)
            except TimeoutError:
                eng.log(
                    f"ERROR: bootstrap_room {room}: no decode fetched the KV cache "
                    f"within {eng.kv_timeout:.1f}s; aborting the request"
                )
                raise GenError(
                    500,
                    f"KV transfer timed out for bootstrap_room {room}: "
                    f"no decode connected to this prefill's bootstrap server "
                    f"{c.advertised_host}:{c.bootstrap_port} within "
                    f"{eng.kv_timeout:.1f}s",
                ) from None
            finally:
                eng.slots.drop(key)
            return {"_max_tokens": 1}
        if port is None:  # decode
            port = c.bootstrap_port
        try:
            info = await tr.sglang_fetch(eng, str(host), int(port), room, prompt_tokens)
        except tr.KVTransferError as e:
            eng.log(f"ERROR: {e}")
            raise GenError(500, str(e)) from None
        eng.log(
            f"kv: bootstrap_room {room} fetched from {host}:{port} "
            f"({info.get('prompt_tokens')} prompt tokens)"
        )
        return {}

    def _example_storage(self, kvp: dict, prompt_tokens: int, token_ids: list[int]) -> None:
        """vLLM's ExampleConnector: KV through a shared directory."""
        c, eng = self.cfg, self.engine
        path, block = c.shared_storage_path, c.page_size or 16
        if c.vllm_is_consumer:
            hit = tr.example_lookup(path, token_ids, block)
            if hit:
                eng.log(f"kv: External Cache Hit! {hit.get('stored_tokens')} tokens loaded from {path}")
                probs = tr.compat_problems(eng.kv_identity(), hit)
                if probs:
                    raise GenError(500, "KV cache in shared storage is incompatible: " + "; ".join(probs))
            else:
                eng.log(
                    f"kv: no external cache hit in {path} for a {len(token_ids)}-token"
                    f" prompt; computing the prefill locally"
                )
        if c.vllm_is_producer and not (c.vllm_is_consumer and kvp.get("do_remote_prefill")):
            n = tr.example_store(path, token_ids, eng.kv_identity() | {"prompt_tokens": prompt_tokens}, block)
            eng.log(f"kv: saved KV of {n} tokens to {path}")

    def _vllm_prefill(self, conn: str, kvp: dict, prompt_tokens: int, rid: str) -> dict[str, Any]:
        """A vLLM producer holds the KV and answers with the params its decode fetches it by."""
        c, eng = self.cfg, self.engine
        extra: dict[str, Any] = {"kv_transfer_params": None}
        if conn == NIXL:
            host, port = c.nixl_side_channel
            key = rid
            blocks = list(range(0, max(1, -(-prompt_tokens // (c.page_size or 16)))))
            params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_block_ids": blocks,
                "remote_engine_id": eng.engine_id,
                "remote_request_id": key,
                "remote_host": host,
                "remote_port": port,
                "tp_size": c.tp_size,
            }
        elif conn == MOONCAKE:
            host, port = c.mooncake_bootstrap
            key = str(kvp.get("transfer_id") or rid)
            params = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "transfer_id": key,
                "remote_engine_id": eng.engine_id,
                "remote_bootstrap_addr": f"http://{hostport(c.advertised_host, port)}",
            }
        else:
            eng.log(f"kv: {conn} hand-off is not modelled; no kv_transfer_params returned")
            return extra
        try:
            eng.slots.register(key, eng.kv_identity() | {"prompt_tokens": prompt_tokens, "rid": rid})
        except tr.KVTransferError as e:
            raise GenError(500, str(e)) from None
        eng.log(
            f"kv: prefill of {rid} done, KV held for the decode ({conn} "
            f"{params.get('remote_host', '')}{params.get('remote_bootstrap_addr', '')}"
            f"{':' + str(params['remote_port']) if 'remote_port' in params else ''})"
        )
        extra["kv_transfer_params"] = params
        extra["_max_tokens"] = 1
        return extra

    async def _vllm_decode(self, conn: str, kvp: dict, prompt_tokens: int) -> None:
        """A vLLM consumer fetches the prefill's KV before it decodes."""
        eng = self.engine
        try:
            if conn == NIXL:
                info = await tr.nixl_fetch(eng, kvp)
            elif conn == MOONCAKE:
                info = await tr.mooncake_fetch(eng, kvp)
            else:
                eng.log(f"kv: {conn} hand-off is not modelled; computing locally")
                return
        except tr.KVTransferError as e:
            eng.log(f"ERROR: {e}")
            raise GenError(500, str(e)) from None
        if info.get("prompt_tokens") not in (None, prompt_tokens):
            raise GenError(
                500,
                f"KV transfer mismatch: the prefill computed "
                f"{info.get('prompt_tokens')} prompt tokens, this request has "
                f"{prompt_tokens}",
            )
        eng.log(f"kv: loaded remote KV of {info.get('prompt_tokens')} prompt tokens ({conn})")
