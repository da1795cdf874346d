"""The simulated engine's timing model and answer length: in-process, with the clock's sleeps recorded
instead of timed (no timed asserts: what the engine asks to wait is checked, not how long it took)."""

import asyncio
import json

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from sim_harness import sse_events

from muse_launch.sim import textgen as tg
from muse_launch.sim import timing
from muse_launch.sim.config import parse_engine_args
from muse_launch.sim.modeldir import make_model_dir
from muse_launch.sim.server import SimEngine
from muse_launch.sim.timing import Batch, Rates

M = "meta-models/Muse-Spark-Open-816B-A42B-NVFP4"
SGL = ["--model-path", M]
VLLM = [M, "--served-model-name", "tiny"]


def serve(engine_name, argv, tmp_path, fn, rates=None):
    cfg = parse_engine_args(engine_name, argv)

    async def main():
        eng = SimEngine(
            cfg,
            ready_after=0.0,
            state_dir=str(tmp_path),
            out=open("/dev/null", "w"),
            rates=rates or Rates(itl_s=0.0, itl_per_running_s=0.0),
        )
        eng.model_dir = make_model_dir(str(tmp_path), cfg)
        eng.session = aiohttp.ClientSession()
        client = TestClient(TestServer(eng.http_app()))
        await client.start_server()
        try:
            return await fn(client, eng)
        finally:
            await client.close()
            await eng.session.close()

    return asyncio.run(main())


def chat(content="hello there", **extra):
    return {"messages": [{"role": "user", "content": content}], **extra}


def test_rates_shape():
    r = Rates(prefill_tokens_per_s=1000, itl_s=0.01, itl_per_running_s=0.001)
    assert r.prefill_s(500) == 0.5 and r.prefill_s(0) == 0
    assert r.step_s(1) == 0.01
    assert r.step_s(11) == pytest.approx(0.02)  # each other running request adds its share
    assert Rates(prefill_tokens_per_s=1e9).prefill_s(512) < 1e-5


def test_ignore_eos_and_min_tokens_set_the_length(tmp_path):
    async def fn(c, eng):
        out = {}
        for name, body in {
            "ignore_eos": chat(max_tokens=300, ignore_eos=True),
            "min_tokens": chat(max_tokens=300, min_tokens=120),
            "natural": chat(max_tokens=300),
            "capped": chat(max_tokens=5, ignore_eos=True),
        }.items():
            r = await (await c.post("/v1/chat/completions", json=body)).json()
            out[name] = (
                r["usage"]["completion_tokens"],
                r["choices"][0]["finish_reason"],
                len(tg.pieces(r["choices"][0]["message"]["content"])),
            )
        bad = await c.post("/v1/chat/completions", json=chat(max_tokens=10, min_tokens=20))
        return out, bad.status

    out, bad = serve("sglang", SGL, tmp_path, fn)
    assert out["ignore_eos"] == (300, "length", 300)
    assert out["min_tokens"] == (120, "stop", 120)
    assert out["natural"][0] < 120 and out["natural"][1] == "stop"
    assert out["capped"] == (5, "length", 5)
    assert bad == 400


def test_completions_and_generate_honour_ignore_eos(tmp_path):
    async def fn(c, eng):
        comp = await (
            await c.post("/v1/completions", json={"prompt": "say", "max_tokens": 200, "ignore_eos": True})
        ).json()
        gen = await (
            await c.post(
                "/generate",
                json={"text": "say", "sampling_params": {"max_new_tokens": 150, "min_new_tokens": 90}},
            )
        ).json()
        return comp["usage"]["completion_tokens"], gen["meta_info"]["completion_tokens"]

    assert serve("sglang", SGL, tmp_path, fn) == (200, 90)


def test_in_flight_until_the_last_token(tmp_path):
    """/get_load and /metrics count a streamed request as running until its last chunk, as SGLang and
    vLLM do (a drain waits on this count)."""

    async def fn(c, eng):
        resp = await c.post("/v1/chat/completions", json=chat(max_tokens=40, ignore_eos=True, stream=True))
        first = await resp.content.readline()
        during = (await (await c.get("/get_load")).json())[0]["num_reqs"]
        metrics_during = await (await c.get("/metrics")).text()
        rest = await resp.read()
        after = (await (await c.get("/get_load")).json())[0]["num_reqs"]
        metrics_after = await (await c.get("/metrics")).text()
        return first, during, metrics_during, rest, after, metrics_after

    first, during, m_during, rest, after, m_after = serve(
        "sglang", SGL, tmp_path, fn, Rates(itl_s=0.02, itl_per_running_s=0.0)
    )
    assert first.startswith(b"data:")
    assert during == 1 and 'sglang:num_running_reqs{model_name="' + M + '"} 1' in m_during
    assert rest.rstrip().endswith(b"data: [DONE]")
    assert after == 0
    assert f'sglang:generation_tokens_total{{model_name="{M}"}} 40' in m_after


def test_v1_loads_counts_as_sglang_0_5_23_does_and_health_generates_uncounted(tmp_path):
    """/v1/loads ({"loads": [...]}, num_running_reqs) counts a streamed request until its last chunk; /health
    runs a one-token generation (it waits behind a prefill) that no metric counts."""

    async def fn(c, eng):
        resp = await c.post("/v1/chat/completions", json=chat(max_tokens=20, ignore_eos=True, stream=True))
        await resp.content.readline()
        during = (await (await c.get("/v1/loads")).json())["loads"][0]
        await resp.read()
        after = (await (await c.get("/v1/loads")).json())["loads"][0]
        health = (await c.get("/health")).status
        metrics = await (await c.get("/metrics")).text()
        return during, after, health, metrics

    rates = Rates(itl_s=0.01, itl_per_running_s=0.0)
    during, after, health, metrics = serve("sglang", SGL, tmp_path, fn, rates)
    assert during["num_running_reqs"] == 1 and after["num_running_reqs"] == 0 and health == 200
    assert f'sglang:generation_tokens_total{{model_name="{M}"}} 20' in metrics


def test_queued_beyond_max_running(tmp_path):
    async def fn(c, eng):
        first = await c.post("/v1/chat/completions", json=chat(max_tokens=30, ignore_eos=True, stream=True))
        await first.content.readline()
        second = asyncio.ensure_future(c.post("/v1/chat/completions", json=chat(max_tokens=2)))
        load = None
        for _ in range(500):  # until the second request is seen waiting
            load = (await (await c.get("/get_load")).json())[0]
            if load["num_waiting_reqs"]:
                break
            await asyncio.sleep(0.005)
        await first.read()
        done = await second
        return load, done.status

    load, status = serve("vllm", VLLM, tmp_path, fn, Rates(itl_s=0.01, max_running=1))
    assert load == {"dp_rank": 0, "num_reqs": 1, "num_waiting_reqs": 1, "num_tokens": 0}
    assert status == 200


def test_clock_prefill_then_steps_growing_with_the_batch(tmp_path, monkeypatch):
    """What the engine asks to sleep: one prefill of prompt/rate, then one step per token after the
    first, each as long as the running batch makes it."""
    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def record(seconds, *a, **k):
        if seconds:  # aiohttp yields with sleep(0) too
            slept.append(round(seconds, 6))
        await real_sleep(0)

    monkeypatch.setattr(timing.asyncio, "sleep", record)
    rates = Rates(prefill_tokens_per_s=1000, itl_s=0.01, itl_per_running_s=0.002)

    async def one(c, eng):
        r = await c.post(
            "/v1/chat/completions",
            json=chat(" ".join(["word"] * 100), max_tokens=5, ignore_eos=True, stream=True),
        )
        return sse_events(await r.text())

    events = serve("sglang", SGL, tmp_path, one, rates)
    prompt = len(tg.chat_prompt_tokens([{"role": "user", "content": " ".join(["word"] * 100)}], None))
    assert slept == [prompt / 1000] + [0.01] * 4
    assert events[-1] == "[DONE]"

    batch = Batch(rates)
    batch.counters.running = 5
    slept.clear()
    asyncio.run(batch.step())
    assert slept == [pytest.approx(0.01 + 0.002 * 4)]


def test_rates_from_the_command_line():
    from muse_launch.sim.cli import build_parser

    ns, _ = build_parser().parse_known_args(
        [
            "--engine",
            "vllm",
            "--itl",
            "0.01",
            "--itl-per-running",
            "0.001",
            "--prefill-tokens-per-s",
            "8000",
            "--max-running",
            "4",
        ]
    )
    assert (ns.itl, ns.itl_per_running, ns.prefill_tokens_per_s, ns.max_running) == (0.01, 0.001, 8000.0, 4)
    for bad in (["--itl", "-1"], ["--prefill-tokens-per-s", "0"], ["--max-running", "0"], ["--itl", "inf"]):
        with pytest.raises(SystemExit):
            build_parser().parse_known_args(["--engine", "vllm", *bad])


@pytest.mark.bench
def test_model_dir_tokenizer_counts_as_the_engine(tmp_path):
    """The tokenizer a load generator loads from the model directory counts a prompt and an answer as
    the engine does, so requested and served lengths agree."""
    from tokenizers import Tokenizer

    cfg = parse_engine_args("sglang", SGL)
    tok = Tokenizer.from_file(
        str(__import__("pathlib").Path(make_model_dir(str(tmp_path), cfg)) / "tokenizer.json")
    )
    prompt = (
        "From fairest creatures we desire increase, that thereby beauty's rose might never die <unk> zyzzyva"
    )
    assert len(tok.encode(prompt).ids) == len(tg.tokenize(prompt))
    assert tok.encode("zyzzyva").tokens == ["<unk>"]
    from muse_launch.sim.vocab import filler

    answer = "".join(filler(7, 256))
    assert len(tok.encode(answer).ids) == 256 == len(tg.pieces(answer))
    assert "<unk>" not in tok.encode(answer).tokens
    decoded = tok.decode(tok.encode("the king and the queen").ids)
    assert (
        decoded == "the king and the queen"
        and len(
            json.loads(
                (tmp_path / "sim-models")
                .joinpath(next(p.name for p in (tmp_path / "sim-models").iterdir()), "config.json")
                .read_text()
            )
        )
        > 0
    )


def test_rehearse_block_reaches_the_simulated_engine(tmp_path):
    """The file's `rehearse:` rates (a role's own win) become the simulated engine's flags; bad ones exit
    2."""
    import yaml

    from muse_launch.core import load_plan
    from muse_launch.errors import TopologyError

    path = tmp_path / "t.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "t",
                "hardware": "b300",
                "model": M,
                "rehearse": {"itl_ms": 5, "prefill_tokens_per_s": 20000, "itl_ms_per_running": 0.5},
                "roles": {
                    "worker": {
                        "kind": "worker",
                        "gpus": "0-7",
                        "tp": 8,
                        "port": 31101,
                        "rehearse": {"itl_ms": 4, "max_running": 8},
                    },
                    "router": {"kind": "router", "port": 31100, "workers": ["worker"]},
                },
            }
        )
    )
    argv = load_plan(path, rehearse=True).plan.spec("worker").argv
    flags = argv[argv.index("--engine") : argv.index("--")]
    assert flags[flags.index("--itl") + 1] == "0.004" and flags[flags.index("--max-running") + 1] == "8"
    assert flags[flags.index("--prefill-tokens-per-s") + 1] == "20000"
    assert flags[flags.index("--itl-per-running") + 1] == "0.0005"
    assert (
        "--itl" not in load_plan(path).plan.spec("worker").argv
    )  # only a rehearsal runs the simulated engine
    for bad in (
        "rehearse.itl_ms=-1",
        "rehearse.max_running=0",
        "rehearse.prefill_tokens_per_s=0",
        "rehearse.itl_ms=.inf",
        "rehearse.speed=3",
    ):
        with pytest.raises(TopologyError):
            load_plan(path, [bad], rehearse=True)
