"""A decode worker that dies (SIGKILL) or hangs (SIGSTOP) under a steady load through the real sglang-router
(a rehearsal, two decodes, 8 streaming chats in a closed loop) costs only the requests it held: the
supervisor takes it out of the router, stops a hung one, restarts it and puts it back. What is asserted is
what no timing can blur: no request that began after the worker was out of the router fails, no more fail
than were in flight, it serves again, and nothing is left alive after `down`."""

from __future__ import annotations

import os
import signal
import time

import pytest
from harness import free_ports, wait_for
from router_watch import OutWatch, listed_urls  # noqa: E402
from steady_load import SteadyLoad
from test_run_live_changes import MODEL, down_clean, generated, pd_topology, up

from muse_launch.engines.router import REMOVAL_SETTLE_S

pytestmark = [pytest.mark.integration, pytest.mark.rehearsal]

CLIENTS = 8


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_decode_killed_or_hung_under_load_fails_only_requests_it_held(deployment, fault):
    d = deployment
    ports = free_ports(5)
    up(d, pd_topology(d, ports, decode_replicas=2))
    router_url = f"http://127.0.0.1:{ports[2]}"
    victim_url = f"http://127.0.0.1:{ports[1] + 1}"
    victim = d.role("decode-1")
    with SteadyLoad(router_url, MODEL, concurrency=CLIENTS) as load:
        load.wait_for(16)
        watch = OutWatch(router_url, victim_url)
        faulted_at = time.monotonic()
        os.kill(victim["pid"], signal.Signals[fault])
        try:
            wait_for(lambda: watch.out_at is not None, timeout=30, interval=0.02)
            out_after = watch.out_at - faulted_at
            # Restarted (a hung one: stopped first), ready, and back in the router.
            wait_for(lambda: d.role("decode-1")["restarts"] >= 1, timeout=60)
            wait_for(lambda: victim_url in (listed_urls(router_url) or set()), timeout=90)
            before = generated(victim_url)
            load.wait_for(16)
            wait_for(lambda: generated(victim_url) > before, timeout=60)  # it serves again
        finally:
            watch.stop()
            if fault == "SIGSTOP":
                try:
                    os.kill(victim["pid"], signal.SIGCONT)
                except ProcessLookupError:
                    pass
    late = [b - faulted_at for b in load.failed_began if b > watch.out_at + REMOVAL_SETTLE_S]
    assert late == [], (f"out of the router {out_after:.2f}s after the {fault}", late, load.failures)
    assert len(load.failures) <= CLIENTS, load.failures
    assert d.role("decode-1")["state"] == "ready"
    assert d.role("decode-1")["pid"] != victim["pid"]
    down_clean(d)
