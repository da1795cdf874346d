"""smg 1.13.0, the successor of sglang-router: the same PD syntax, and `--backend vllm` for vLLM workers."""

from __future__ import annotations

from functools import partial

from . import router, sglang_router
from .router import PORT_FLAGS, SHADOWED, WIRING  # noqa: F401  the routers' shared command line

FACTS = router.RouterFacts(
    name="smg",
    default_launcher=("smg", "launch"),
    pd_flag=sglang_router.FACTS.pd_flag,
    backend_flag=("--backend", "vllm"),
    cut_stream="error-event",
)
NAME, DEFAULT_LAUNCHER = FACTS.name, FACTS.default_launcher
DISTRIBUTIONS = ("smg",)  # what provides it (host/versions.py reads the installed release)
MODULE = "smg"
render = partial(router.render, facts=FACTS)
