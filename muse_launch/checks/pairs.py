"""Prefill/decode pairs behind one router must hand KV over: same engine, model, backend, dtype, page size."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from ..engines import ROUTER_ENGINES, WORKER, router
from ..engines.argv import has_flag
from ..engines.base import WorkerEngine
from ..plan.spec import LaunchSpec
from .findings import CheckContext, Finding, error, plan_check
from .ports import by_url
from .reading import key_flags, origin, roles

Reader = Callable[[WorkerEngine, tuple[str, ...]], str | None]
# (what, structured key, the engine's reader of it)
PAIR_FACTS: tuple[tuple[str, str | None, Reader], ...] = (
    ("model", "model", lambda e, args: e.model(args)),
    ("served model name", None, lambda e, args: e.served_model_name(args)),
    ("transfer backend", "transfer_backend", lambda e, args: e.transfer_backend(args)),
    ("KV-cache dtype", "kv_cache_dtype", lambda e, args: e.kv_cache_dtype(args)),
    ("page size", "page_size", lambda e, args: e.page_size(args)),
)


def _read(spec: LaunchSpec) -> tuple[str | None, ...]:
    engine = WORKER[spec.engine]
    return (spec.engine, *(reader(engine, spec.args) for _, _, reader in PAIR_FACTS))


def _flags(engine: str, what: str, key: str | None) -> tuple[str, ...]:
    """The flags that decide a pair fact, for pointing at where it was set."""
    worker = WORKER[engine]
    if what == "served model name":
        return (worker.SERVED_MODEL_NAME,)
    if what == "transfer backend":
        return worker.TRANSFER_BACKEND_FLAGS
    return key_flags(engine).get(key, ()) if key else ()


@plan_check
def pd_pairs_agree(ctx: CheckContext) -> Iterator[Finding]:
    """A router's prefill and decode must hand KV over: same engine, model, backend, dtype, page size."""
    urls = by_url(ctx)
    reported: set[tuple[str, str, str]] = set()
    # Read each worker's facts once: a router over P prefills and D decodes makes P x D pairs.
    facts = {s.name: _read(s) for s in urls.values() if s.kind in ("prefill", "decode")}
    for front in roles(ctx, ROUTER_ENGINES):
        # By kind too: replicas whose ports step onto another role's give that role's URL (a port check
        # reports the clash; this one must not read a router as a worker)
        prefills = [urls[u] for u, _ in router.prefills(front.args) if u in urls and urls[u].name in facts]
        decodes = [urls[u] for u in router.decodes(front.args) if u in urls and urls[u].name in facts]
        for prefill in prefills:
            for decode in decodes:
                if facts[prefill.name] == facts[decode.name]:
                    continue
                if prefill.engine != decode.engine:
                    if (prefill.role, decode.role, "engine") not in reported:
                        reported.add((prefill.role, decode.role, "engine"))
                        yield error(
                            ("roles", decode.role, "engine"),
                            f"{decode.role} runs {decode.engine} but its "
                            f"prefill {prefill.role} runs {prefill.engine}; KV cannot pass between engines",
                            "run both on one engine",
                            prefill.role,
                            decode.role,
                            front.role,
                        )
                    continue
                for i, (what, key, _) in enumerate(PAIR_FACTS, 1):
                    mine, theirs = facts[decode.name][i], facts[prefill.name][i]
                    if mine == theirs or (prefill.role, decode.role, what) in reported:
                        continue
                    reported.add((prefill.role, decode.role, what))
                    if (
                        what == "served model name"
                        and (prefill.role, decode.role, "model") in reported
                        and not any(
                            has_flag(s.args, WORKER[s.engine].SERVED_MODEL_NAME) for s in (prefill, decode)
                        )
                    ):
                        continue  # both names are the model paths, already reported
                    yield error(
                        origin(ctx, decode, _flags(decode.engine, what, key), key),
                        f"{decode.role} has {_fact(what, mine)} but {prefill.role} has "
                        f"{_fact(what, theirs)}; {front.role} pairs them, so KV from one must fit the other",
                        f"give {decode.role} the same {what} as {prefill.role} ({theirs or 'the default'})",
                        prefill.role,
                        decode.role,
                    )


def _fact(what: str, value: str | None) -> str:
    return f"{what} {value}" if value is not None else f"the default {what}"
