"""GET /metrics of the simulated engine: SGLang's and vLLM's own names, in text format, from its counters."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from muse_launch.engines.metrics import SGLANG, VLLM
from muse_launch.sim.config import parse_engine_args
from muse_launch.sim.modeldir import make_model_dir
from muse_launch.sim.server import SimEngine
from muse_launch.top.prom import parse

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 30}


def run(engine_name, argv, tmp_path, fn, itl=0.0):
    cfg = parse_engine_args(engine_name, argv)

    async def main():
        eng = SimEngine(cfg, ready_after=0.0, state_dir=str(tmp_path), itl=itl, out=open("/dev/null", "w"))
        eng.model_dir = make_model_dir(str(tmp_path), cfg)
        eng.session = aiohttp.ClientSession()
        client = TestClient(TestServer(eng.http_app()))
        await client.start_server()
        try:
            return await fn(client)
        finally:
            await client.close()
            await eng.session.close()

    return asyncio.run(main())


async def _metrics(client):
    answer = await client.get("/metrics")
    assert answer.status == 200 and answer.content_type == "text/plain"
    return parse(await answer.text())


def test_sglang_counts_tokens_and_first_tokens_as_the_answers_say(tmp_path):
    async def fn(c):
        before = await _metrics(c)
        usage = (await (await c.post("/v1/chat/completions", json=CHAT)).json())["usage"]
        stream = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await stream.read()
        await (await c.post("/v1/completions", json={"prompt": "one two three", "max_tokens": 5})).json()
        return before, usage, await _metrics(c)

    before, usage, after = run("sglang", ["--model-path", M], tmp_path, fn)
    assert before.values(SGLANG.prompt_tokens) == [0.0] and before.values(SGLANG.running) == [0.0]
    assert after.bad_lines == 0
    assert after.values(SGLANG.prompt_tokens) == [2 * usage["prompt_tokens"] + 3]
    assert after.values(SGLANG.generation_tokens) == [2 * usage["completion_tokens"] + 5]
    assert after.values(f"{SGLANG.ttft}_count") == [3.0]
    assert after.values(f"{SGLANG.ttft}_sum")[0] > 0
    assert after.by_label(f"{SGLANG.ttft}_bucket", "le")["+Inf"] == 3.0
    assert after.values(SGLANG.running) == [0.0] and after.values(SGLANG.queued) == [0.0]
    assert after.values(SGLANG.kv_usage) == [0.0]  # nothing in flight holds KV cache
    assert after.samples[0].labels == {"model_name": M}


def test_a_stream_counts_as_running_until_its_last_chunk(tmp_path):
    async def fn(c):
        stream = asyncio.ensure_future(c.post("/v1/chat/completions", json={**CHAT, "stream": True}))
        seen = []
        for _ in range(200):  # poll while the stream runs (60 chunks, 20 ms apart)
            seen.append((await _metrics(c)).values(SGLANG.running)[0])
            if seen[-1]:
                break
            await asyncio.sleep(0.01)
        during = await _metrics(c)
        answer = await stream
        await answer.read()
        return seen, during, await _metrics(c)

    seen, during, after = run("sglang", ["--model-path", M], tmp_path, fn, itl=0.02)
    assert 1.0 in seen
    assert during.values(SGLANG.kv_usage)[0] > 0  # the request's tokens are resident while it runs
    assert after.values(SGLANG.running) == [0.0] and after.values(SGLANG.kv_usage) == [0.0]


def test_vllm_names_and_its_engine_label(tmp_path):
    async def fn(c):
        await (await c.post("/v1/chat/completions", json={**CHAT, "model": M})).json()
        return await (await c.get("/metrics")).text()

    text = run("vllm", [M], tmp_path, fn)
    parsed = parse(text)
    for name in (
        VLLM.running,
        VLLM.queued,
        VLLM.kv_usage,
        VLLM.prompt_tokens,
        VLLM.generation_tokens,
        f"{VLLM.ttft}_count",
    ):
        assert parsed.by_label(name, "engine").keys() == {"0"}, name
    assert parsed.values(VLLM.generation_tokens)[0] > 0
    assert f"# TYPE {VLLM.prompt_tokens} counter" in text
    assert 'vllm:num_requests_running{engine="0"' in text  # what vllm-router counts DP engines by


def test_a_hostile_served_model_name_stays_inside_its_label(tmp_path):
    name = 'x"} 1\nevil_metric 666\n#'

    async def fn(c):
        return await (await c.get("/metrics")).text()

    parsed = parse(run("sglang", ["--model-path", M, "--served-model-name", name], tmp_path, fn))
    assert parsed.values("evil_metric") == [] and parsed.bad_lines == 0
    assert parsed.samples[0].labels["model_name"] == name


def test_inter_token_latency_is_a_histogram_top_reads(tmp_path):
    """Each token after the first is one observation of SGLang's and vLLM's ITL histogram, and top's own
    reader finds it (the autoscaler's decode signal)."""
    from muse_launch.top.collect import ITL_HISTOGRAMS, _histograms, quantile

    async def fn(c):
        stream = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await stream.read()
        return await (await c.get("/metrics")).text()

    for engine, argv in (("sglang", ["--model-path", M]), ("vllm", [M])):
        (tmp_path / engine).mkdir()
        text = run(engine, argv, tmp_path / engine, fn, itl=0.01)
        name = ITL_HISTOGRAMS[engine][0]
        parsed = parse(text)
        assert f"# TYPE {name} histogram" in text
        steps = parsed.values(f"{name}_count")[0]
        assert (
            steps
            == parsed.values(SGLANG.generation_tokens if engine == "sglang" else VLLM.generation_tokens)[0]
            - 1
        )  # one gap between each two tokens of the one answer
        itl = _histograms(parsed, engine)["itl"]
        assert 0.01 <= quantile(0.5, itl) < 0.05
