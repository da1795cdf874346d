"""The generation endpoints: OpenAI chat and completions, SGLang's native /generate.

The text comes from :mod:`.textgen`; media go to an encoder on an EPD language worker
(:mod:`.encoders`); on a prefill or decode the request first does its part of the KV hand-off
(:mod:`.handoff`).
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from aiohttp import web

from . import responses as rs
from . import textgen as tg
from .api import GenError

if TYPE_CHECKING:
    from .api import Api


class Generation:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.engine = api.engine
        self.cfg = api.cfg

    async def h_chat(self, request: web.Request) -> web.StreamResponse:
        body, pre = await self.api.admit(request)
        if pre is not None:
            return pre
        async with self.engine.batch.admitted():  # running until the last token is written
            return await self._chat(request, body)

    async def _chat(self, request: web.Request, body: dict) -> web.StreamResponse:
        c = self.cfg
        rid = uuid.uuid4().hex
        try:
            self.api.check_vllm_model(body)
            plan = tg.plan_chat(
                body,
                engine=c.engine,
                served_name=c.served_model_name,
                reasoning_parser=c.reasoning_parser,
                tool_call_parser=c.tool_call_parser,
                enable_auto_tool_choice=c.enable_auto_tool_choice,
            )
            ptoks = tg.chat_prompt_tokens(body["messages"], body.get("tools"))
            prompt_tokens = len(ptoks)
            media = tg.media_items(body["messages"])
            if media and c.language_only and c.disaggregation_mode != "decode":
                prompt_tokens += await self.engine.encoders.encode_media(len(media), rid)
            elif media:
                prompt_tokens += len(media) * tg.TOKENS_PER_MEDIA_ITEM
            max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
            self.api.check_length(prompt_tokens, max_tokens)
            target = tg.length_target(max_tokens, body.get("min_tokens"), body.get("ignore_eos"))
            self.engine.batch.count_prompt(prompt_tokens)
            extra = await self.engine.kv.stage(body, prompt_tokens, rid, [tg.token_id(t) for t in ptoks])
            if "_max_tokens" in extra:
                max_tokens = extra.pop("_max_tokens")
                target = min(target, int(max_tokens))
            out = tg.lengthen(
                tg.realize(plan, max_tokens),
                target,
                max_tokens,
                tg.content_text(body["messages"][-1].get("content")),
            )
        except tg.RequestError as e:
            return self.api.error_of(e)
        self.engine.metrics.count(prompt_tokens, out.completion_tokens)  # resident in the KV cache
        model = self.api.response_model(body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self.api.sse(
                request,
                rs.chat_chunks(c.engine, model, out, prompt_tokens, include_usage),
                out.completion_tokens,
            )
        await self.api.decode(out.completion_tokens)
        return web.json_response(rs.chat_response(c.engine, model, out, prompt_tokens, extra))

    async def h_completions(self, request: web.Request) -> web.StreamResponse:
        body, pre = await self.api.admit(request)
        if pre is not None:
            return pre
        async with self.engine.batch.admitted():
            return await self._completions(request, body)

    async def _completions(self, request: web.Request, body: dict) -> web.StreamResponse:
        c = self.cfg
        rid = uuid.uuid4().hex
        try:
            self.api.check_vllm_model(body)
            prompt = body.get("prompt")
            if prompt is None:
                raise GenError(400, "prompt is required", param="prompt")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                ids = [int(x) for x in prompt]
            elif isinstance(prompt, list):
                ids = [tg.token_id(t) for p in prompt for t in tg.tokenize(str(p))]
            else:
                ids = tg.token_ids(str(prompt))
            prompt_tokens = len(ids)
            max_tokens = body.get("max_tokens", 16 if c.engine == "vllm" else None)
            self.api.check_length(prompt_tokens, max_tokens)
            target = tg.length_target(max_tokens, body.get("min_tokens"), body.get("ignore_eos"))
            self.engine.batch.count_prompt(prompt_tokens)
            extra = await self.engine.kv.stage(body, prompt_tokens, rid, ids)
            if "_max_tokens" in extra:
                max_tokens = extra.pop("_max_tokens")
                target = min(target, int(max_tokens))
        except tg.RequestError as e:
            return self.api.error_of(e)
        ps, finish, n = tg.realize_text(
            tg.completion_text(prompt_tokens, c.served_model_name, c.engine), max_tokens
        )
        ps, finish, n = tg.lengthen_text(ps, finish, target, max_tokens, str(prompt))
        self.engine.metrics.count(prompt_tokens, n)
        model = self.api.response_model(body)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self.api.sse(
                request, rs.completion_chunks(c.engine, model, ps, finish, prompt_tokens, include_usage), n
            )
        await self.api.decode(n)
        return web.json_response(
            rs.completion_response(c.engine, model, "".join(ps), finish, prompt_tokens, n, extra)
        )

    async def h_generate(self, request: web.Request) -> web.StreamResponse:
        body, pre = await self.api.admit(request, native=True)
        if pre is not None:
            return pre
        async with self.engine.batch.admitted():
            return await self._generate(request, body)

    async def _generate(self, request: web.Request, body: dict) -> web.StreamResponse:
        c = self.cfg
        started = time.time()
        text, input_ids = body.get("text"), body.get("input_ids")
        if text is None and input_ids is None:
            return self.api.error(400, "Either text or input_ids should be provided.", native=True)
        batch = isinstance(text, list) or (
            isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list)
        )
        prompts = (
            (text if isinstance(text, list) else [text])
            if text is not None
            else (input_ids if batch else [input_ids])
        )
        sp = body.get("sampling_params") or {}
        if isinstance(sp, list):
            sp = sp[0] if sp else {}
        max_new = sp.get("max_new_tokens", 128)
        if batch and body.get("stream"):
            return self.api.error(
                400, "streaming is not supported for batch requests in the simulator", native=True
            )
        results = []
        for i, p in enumerate(prompts):
            ids = [int(x) for x in p] if isinstance(p, list) else tg.token_ids(str(p))
            rid = body.get("rid") if isinstance(body.get("rid"), str) else uuid.uuid4().hex
            if batch:
                rid = f"{rid}-{i}"
            try:
                self.api.check_length(len(ids), max_new)
                target = tg.length_target(max_new, sp.get("min_new_tokens"), sp.get("ignore_eos"))
                self.engine.batch.count_prompt(len(ids))
                extra = await self.engine.kv.stage(body, len(ids), rid, ids)
            except tg.RequestError as e:
                return self.api.error_of(e, native=True)
            mt = extra.get("_max_tokens", max_new)
            ps, finish, n = tg.realize_text(tg.completion_text(len(ids), c.served_model_name, c.engine), mt)
            ps, finish, n = tg.lengthen_text(
                ps, finish, min(target, int(mt)) if mt is not None else target, mt, str(p)
            )
            results.append((rid, ids, ps, finish, n))
            self.engine.metrics.count(len(ids), n)
        if body.get("stream"):
            rid, ids, ps, finish, n = results[0]

            def events():
                acc: list[str] = []
                for j, p in enumerate(ps):
                    acc.append(p)
                    last = j == len(ps) - 1
                    meta = rs.generate_meta(rid, finish, len(ids), j + 1, started, max_new)
                    if not last:
                        meta["finish_reason"] = None
                    yield {
                        "text": "".join(acc),
                        "output_ids": [tg.token_id(x) for x in acc],
                        "meta_info": meta,
                        "index": 0,
                    }
                if not ps:
                    yield {
                        "text": "",
                        "output_ids": [],
                        "index": 0,
                        "meta_info": rs.generate_meta(rid, finish, len(ids), 0, started, max_new),
                    }

            return await self.api.sse(request, events(), n)
        await self.api.decode(max(r[4] for r in results))
        out = [
            {
                "text": "".join(ps),
                "output_ids": [tg.token_id(x) for x in ps],
                "meta_info": rs.generate_meta(rid, finish, len(ids), n, started, max_new),
            }
            for rid, ids, ps, finish, n in results
        ]
        return web.json_response(out if batch else out[0])
