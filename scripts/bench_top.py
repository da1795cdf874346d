"""What one `top` refresh costs to read a server's metrics: parse time of a vLLM-sized answer, whole against
the line-by-line path a single bad line sends it down, side by side (ratios, not timed asserts).

    .venv/bin/python scripts/bench_top.py [--engines 8]
"""

from __future__ import annotations

import argparse
import time

from muse_launch.sim.metrics import TTFT_BUCKETS
from muse_launch.top.collect import WANTED
from muse_launch.top.prom import parse

BUCKETS = TTFT_BUCKETS  # vLLM's, as the simulated engine serves them
HISTOGRAMS = (
    "time_to_first_token_seconds",
    "inter_token_latency_seconds",
    "e2e_request_latency_seconds",
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
)


def exposition(engines: int) -> str:
    out = []
    for e in range(engines):
        labels = f'engine="{e}",model_name="meta-models/Muse-Spark-Open-816B-A42B-NVFP4"'
        for g in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"):
            out += [f"# TYPE vllm:{g} gauge", f"vllm:{g}{{{labels}}} {e}.0"]
        for c in ("prompt_tokens_total", "generation_tokens_total", "request_success_total"):
            out += [f"# TYPE vllm:{c} counter", f"vllm:{c}{{{labels}}} {e * 1000}.0"]
        for h in HISTOGRAMS:
            out.append(f"# TYPE vllm:{h} histogram")
            out += [f'vllm:{h}_bucket{{{labels},le="{b}"}} {i}.0' for i, b in enumerate((*BUCKETS, "+Inf"))]
            out += [f"vllm:{h}_sum{{{labels}}} 12.5", f"vllm:{h}_count{{{labels}}} 40.0"]
    return "\n".join(out) + "\n"


def timed(text: str, rounds: int, wanted=None) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        parse(text, wanted)
    return (time.perf_counter() - start) / rounds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    text = exposition(args.engines)
    every = timed(text, args.rounds)
    wanted = timed(text, args.rounds, WANTED["vllm"])
    broken = timed('vllm:num_requests_running{x="1} 3\n' + text, args.rounds, WANTED["vllm"])
    samples = len(parse(text).samples)
    print(f"answer: {len(text) / 1024:.0f} KiB, {samples} samples ({args.engines} DP engines)")
    print(f"parse, every sample:          {every * 1000:7.2f} ms")
    print(f"parse, the names top reads:   {wanted * 1000:7.2f} ms  ({every / wanted:.0f}x faster)")
    print(f"  with one bad line among them: {broken * 1000:5.2f} ms  ({broken / wanted:.1f}x: line by line)")
    print(f"share of a 1 s refresh:       {wanted * 100:7.2f} %  (per server)")


if __name__ == "__main__":
    main()
