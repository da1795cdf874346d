"""vllm-router 0.1.17: PD routing for vLLM workers (`--prefill URL` without a bootstrap port unless Mooncake)."""

from __future__ import annotations

from . import router
from .base import Context, Instance, Rendered

FACTS = router.RouterFacts(
    name="vllm-router", default_launcher=("vllm-router",), pd_flag="--vllm-pd-disaggregation",
    # It checks its workers every 30 s while starting; its readiness would lag theirs by as much.
    startup_defaults=(("--worker-startup-check-interval", "1"),),
    bootstrap_none=False, kv_connector_flag="--kv-connector", workers_path="/list_workers")
NAME = FACTS.name
DISTRIBUTIONS = ("vllm-router",)  # what provides it (host/versions.py reads the installed release)
MODULE = "vllm_router"
DEFAULT_LAUNCHER = FACTS.default_launcher
PORT_FLAGS = router.PORT_FLAGS
SHADOWED = router.SHADOWED
WIRING = router.WIRING


def render(inst: Instance, ctx: Context) -> Rendered:
    return router.render(inst, ctx, FACTS)
