"""vllm-router 0.1.17: PD routing for vLLM workers (`--prefill URL` without a bootstrap port unless
Mooncake)."""

from __future__ import annotations

from .router import RouterEngine, RouterFacts


class VLLMRouter(RouterEngine):
    FACTS = RouterFacts(
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
    RELEASE = "0.1.17"
    DISTRIBUTIONS = ("vllm-router",)
    MODULES = ("vllm_router",)


ENGINE = VLLMRouter()
