"""A worker's signs of life: silence counts from its last answer; a stall only while it holds requests."""

from __future__ import annotations

from muse_launch.supervise.liveness import Liveness, Sign


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
