"""One module per engine, each the one home of that engine's facts: flag spellings for each topology
key, choices, default ports, which ports it binds, its renderer and the reader of a rendered argv.

Adding an engine: one module with NAME, DEFAULT_LAUNCHER, PORT_FLAGS, SHADOWED, render() and FACTS (a
WorkerFacts for a worker engine, a router.RouterFacts for a router), and one line in muse_launch/registry.py.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from .. import registry
from .base import WorkerFacts
from .router import RouterFacts

ENGINES: dict[str, ModuleType] = {
    name: import_module(path)
    for name, path in {**registry.WORKER_ENGINES, **registry.ROUTER_ENGINES, **registry.OTHER_ENGINES}.items()
}
WORKER_ENGINES = tuple(
    registry.WORKER_ENGINES
)  # serve a model; readers: model(), parallel(), mem_fraction(), ...
ROUTER_ENGINES = tuple(registry.ROUTER_ENGINES)
WORKERS: dict[str, WorkerFacts] = {name: ENGINES[name].FACTS for name in WORKER_ENGINES}
ROUTERS: dict[str, RouterFacts] = {name: ENGINES[name].FACTS for name in ROUTER_ENGINES}


def engine(name: str) -> ModuleType:
    return ENGINES[name]


def worker_facts(name: str) -> WorkerFacts | None:
    """A worker engine's facts; None for a router or a command."""
    return WORKERS.get(name)


def image_carrier(name: str) -> WorkerFacts | None:
    """The worker engine whose container image ships `name`'s program: its own, or for a router the one whose
    image carries it; None: it runs on the host."""
    if name in WORKERS:
        return WORKERS[name]
    shipped_in = ROUTERS[name].shipped_in if name in ROUTERS else None
    return WORKERS.get(shipped_in) if shipped_in else None
