"""vllm-router 0.1.17: PD routing for vLLM workers (`--prefill URL` without a bootstrap port unless
Mooncake)."""

from __future__ import annotations

from functools import partial

from . import router
from .router import PORT_FLAGS, SHADOWED, WIRING  # noqa: F401  the routers' shared command line

FACTS = router.RouterFacts(
    name="vllm-router",
    default_launcher=("vllm-router",),
    pd_flag="--vllm-pd-disaggregation",
    # It checks its workers every 30 s while starting; its readiness would lag theirs by as much.
    startup_defaults=(("--worker-startup-check-interval", "1"),),
    bootstrap_none=False,
    kv_connector_flag="--kv-connector",
    workers_path="/list_workers",
    adds_workers=False,
    retries_unstarted=False,  # 3 of 5 failures were new requests: 500 "Connection refused", no retry
    unhealthy_after_s=2.3,
)
NAME, DEFAULT_LAUNCHER = FACTS.name, FACTS.default_launcher
DISTRIBUTIONS = ("vllm-router",)  # what provides it (host/versions.py reads the installed release)
MODULE = "vllm_router"
render = partial(router.render, facts=FACTS)
