"""A worker's signs of life: silence counts from its last answer; a stall only while it holds requests."""

from __future__ import annotations

import httpx

from muse_launch.supervise.liveness import Liveness, Sign, look


def test_silence_counts_from_the_last_answer_whatever_it_said():
    live = Liveness(0.0, 0.0)
    live.saw(Sign(True), 1.0)  # a 404 /metrics (SGLang without --enable-metrics) is an answer too
    live.saw(Sign(False), 2.0)
    assert live.silent_for(3.5) == 2.5


def test_a_worker_holding_requests_without_token_progress_stalls_and_an_idle_one_never_does():
    live = Liveness(0.0, 0.0)
    live.saw(Sign(True, running=2, progress=100.0), 1.0)
    live.saw(Sign(True, running=2, progress=100.0), 5.0)
    assert live.stalled_for(9.0) == 8.0  # a long prefill moves the prompt counter; this moved nothing
    live.saw(Sign(True, running=2, progress=140.0), 9.0)
    assert live.stalled_for(9.5) == 0.5
    live.saw(Sign(True, running=0, progress=140.0), 20.0)
    assert live.stalled_for(20.0) == 0.0


def _client(metrics: str, loads) -> httpx.Client:
    """A worker whose /metrics says `metrics` and whose /v1/loads answers `loads` (None: never answers)."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=metrics)
        if request.url.path == "/v1/loads" and loads is not None:
            return httpx.Response(200, json=loads)
        raise httpx.ReadTimeout("no answer", request=request)

    return httpx.Client(transport=httpx.MockTransport(answer))


STALE = "sglang:num_running_reqs 1\nsglang:num_queue_reqs 0\nsglang:generation_tokens_total 7\n"


def test_an_idle_sglang_prefill_whose_gauge_kept_its_last_batch_holds_nothing_by_its_scheduler():
    idle = {"loads": [{"dp_rank": 0, "num_running_reqs": 0, "num_waiting_reqs": 0}]}
    sign = look(_client(STALE, idle), "sglang", "127.0.0.1", 1)
    assert sign == Sign(True, running=0, progress=7.0)
    live = Liveness(0.0, 0.0)
    for t in (1.0, 200.0):
        live.saw(sign, t)
    assert live.stalled_for(200.0) == 0.0  # never restarted as stalled for a gauge set by its last batch


def test_a_hung_sglang_scheduler_keeps_the_gauges_count_and_stalls():
    sign = look(_client(STALE, None), "sglang", "127.0.0.1", 1)  # its scheduler does not answer /v1/loads
    assert sign == Sign(True, running=1, progress=7.0)
    busy = {"loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1}]}
    assert look(_client(STALE, busy), "sglang", "127.0.0.1", 1).running == 4
