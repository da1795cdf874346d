"""One module per engine, each the one home of that engine's facts: flag spellings for each topology
key, choices, default ports, which ports it binds, its renderer and the reader of a rendered argv.

Adding an engine: one module with NAME, DEFAULT_LAUNCHER, PORT_FLAGS, SHADOWED and render(), and one
line here.
"""

from __future__ import annotations

from types import ModuleType

from . import command, sglang, sglang_router, smg, vllm, vllm_router

ENGINES: dict[str, ModuleType] = {m.NAME: m for m in (sglang, vllm, sglang_router, smg, vllm_router, command)}
WORKER_ENGINES = (sglang.NAME, vllm.NAME)  # serve a model; readers: model(), parallel(), mem_fraction(), ...
ROUTER_ENGINES = (sglang_router.NAME, smg.NAME, vllm_router.NAME)


def engine(name: str) -> ModuleType:
    return ENGINES[name]
