"""smg 1.13.0, the successor of sglang-router: the same PD syntax, and `--backend vllm` for vLLM workers."""

from __future__ import annotations

from . import sglang_router
from .router import RouterEngine, RouterFacts


class SMG(RouterEngine):
    FACTS = RouterFacts(
        name="smg",
        default_launcher=("smg", "launch"),
        pd_flag=sglang_router.SGLangRouter.FACTS.pd_flag,
        backend_flag=("--backend", "vllm"),
        cut_stream="error-event",
    )
    NAME, DEFAULT_LAUNCHER = FACTS.name, FACTS.default_launcher
    RELEASE = "1.13.0"
    DISTRIBUTIONS = ("smg",)
    MODULES = ("smg",)


ENGINE = SMG()
