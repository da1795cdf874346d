"""sglang-router 0.3.2 (PyPI `sglang-router`): PD and aggregated routing for SGLang workers."""

from __future__ import annotations

from .router import RouterEngine, RouterFacts


class SGLangRouter(RouterEngine):
    FACTS = RouterFacts(
        name="sglang-router",
        default_launcher=("sglang-router", "launch"),
        pd_flag="--pd-disaggregation",
        shipped_in="sglang",  # the SGLang image has it
        unhealthy_after_s=3.3,
    )
    NAME, DEFAULT_LAUNCHER = FACTS.name, FACTS.default_launcher
    RELEASE = "0.3.2"
    DISTRIBUTIONS = ("sglang-router",)
    MODULES = ("sglang_router",)  # its wheel also installs an `smg` program, which runs this


ENGINE = SGLangRouter()
