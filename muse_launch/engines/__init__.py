"""The engines muse-launch starts, each one object (an Engine, in its module as ENGINE): its facts (flag
spellings for each topology key, choices, default ports, which ports it binds, releases), its renderer, the
readers of a rendered argv and, for a worker, its own rules.

Adding an engine: one module whose ENGINE is an instance of a WorkerEngine (base.py) or a router.RouterEngine
subclass, every fact given (an engine lacking one cannot be made), and one line in muse_launch/registry.py.
"""

from __future__ import annotations

from importlib import import_module
from typing import TypeVar

from .. import registry
from .base import Engine, WorkerEngine, WorkerFacts
from .router import RouterEngine, RouterFacts

E = TypeVar("E", bound=Engine)


def _load(path: str, kind: type[E]) -> E:
    """The ENGINE of the module at `path`, which must be a `kind`."""
    engine = import_module(path).ENGINE
    if not isinstance(engine, kind):
        raise TypeError(f"{path}.ENGINE is not a {kind.__name__}")
    return engine


WORKER: dict[str, WorkerEngine] = {n: _load(p, WorkerEngine) for n, p in registry.WORKER_ENGINES.items()}
ROUTER: dict[str, RouterEngine] = {n: _load(p, RouterEngine) for n, p in registry.ROUTER_ENGINES.items()}
ENGINES: dict[str, Engine] = {
    **WORKER,
    **ROUTER,
    **{n: _load(p, Engine) for n, p in registry.OTHER_ENGINES.items()},
}
WORKER_ENGINES = tuple(WORKER)  # serve a model
ROUTER_ENGINES = tuple(ROUTER)
WORKERS: dict[str, WorkerFacts] = {name: engine.FACTS for name, engine in WORKER.items()}
ROUTERS: dict[str, RouterFacts] = {name: engine.FACTS for name, engine in ROUTER.items()}


def engine(name: str) -> Engine:
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
