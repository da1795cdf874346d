"""smg 1.13.0, the successor of sglang-router: the same PD syntax, and `--backend vllm` for vLLM workers."""

from __future__ import annotations

from . import router, sglang_router
from .base import Context, Instance, Rendered

FACTS = router.RouterFacts(name="smg", default_launcher=("smg", "launch"), pd_flag=sglang_router.FACTS.pd_flag,
                           backend_flag=("--backend", "vllm"))
NAME = FACTS.name
DISTRIBUTIONS = ("smg",)  # what provides it (host/versions.py reads the installed release)
MODULE = "smg"
DEFAULT_LAUNCHER = FACTS.default_launcher
PORT_FLAGS = router.PORT_FLAGS
SHADOWED = router.SHADOWED
WIRING = router.WIRING


def render(inst: Instance, ctx: Context) -> Rendered:
    return router.render(inst, ctx, FACTS)
