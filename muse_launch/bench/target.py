"""What a bench measures: a running deployment's entry URL, model, tokenizer and the engines' counters.

`entry_url` is the one place that knows where a deployment takes requests (its router, else its one
worker); a backend other than this host's supervisor plugs in there. Everything below it only talks
HTTP to the URLs it returns.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from muse_launch.errors import RuntimeFailure, UsageError
from muse_launch.top.deadline import bounded_client

if TYPE_CHECKING:
    from muse_launch.rundir.state import DeploymentRecord, RoleRecord

GENERATING = ("decode", "worker")  # the roles whose tokens reach the client (a prefill writes one of its own)
WORKERS = ("encoder", "prefill", "decode", "worker")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
GENERATION_COUNTER = re.compile(
    r"^(?:sglang|vllm):generation_tokens_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M
)


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # where requests go: the router
    model: str
    tokenizer: str  # a local directory with tokenizer files
    metrics_urls: tuple[str, ...]  # /metrics of the roles whose tokens the client receives
    gpus: int  # GPUs the deployment's workers hold (0 on a CPU deployment)
    simulated: bool  # a rehearsal: every figure is labelled simulated
    versions: dict = field(default_factory=dict)
    source: str = ""  # the topology file
    plan_digest: str = ""
    roles: tuple[dict, ...] = ()


def _local(url: str) -> str:
    return url.replace("0.0.0.0", "127.0.0.1").replace("[::]", "[::1]").rstrip("/")


def front(record: DeploymentRecord) -> RoleRecord:
    routers = [r for r in record.roles if r.kind == "router" and r.url]
    if routers:
        return routers[0]
    workers = [r for r in record.roles if r.kind in GENERATING and r.url]
    if len(workers) == 1:
        return workers[0]
    raise UsageError(
        f"{record.name} has no router, and {len(workers)} workers take requests; bench measures "
        f"one entry URL",
        fix="add a router role in front of the workers",
    )


def entry_url(record: DeploymentRecord) -> str:
    """The deployment's entry URL (the backend seam: a backend that runs roles elsewhere answers here)."""
    return _local(front(record).url or "")


def plan_digest(record: DeploymentRecord) -> str:
    """sha256 of what runs: each role's argv (secrets redacted), ports and GPUs, in start order."""
    shape = [[r.name, list(r.argv), dict(r.ports), list(r.gpus)] for r in record.roles]
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()


def is_simulated(record: DeploymentRecord) -> bool:
    from muse_launch.plan.rehearse import SIMULATED

    return any(SIMULATED in r.argv[:4] for r in record.roles if r.kind in WORKERS)


def _has_tokenizer(path: str | None) -> bool:
    return bool(path) and Path(path).is_dir() and any((Path(path) / f).is_file() for f in TOKENIZER_FILES)


def find_tokenizer(client: httpx.Client, workers: list[str], argv_models: list[str]) -> str | None:
    """A local tokenizer directory the workers serve: what SGLang's /server_info names, what vLLM lists as
    its model's root at /v1/models, else a model path on the command line that is a local directory."""
    for base in workers:
        for path, pick in (
            ("/server_info", lambda j: [j.get("tokenizer_path"), j.get("model_path")]),
            ("/v1/models", lambda j: [m.get("root") for m in j.get("data", [])]),
        ):
            try:
                found = pick(client.get(base + path).json())
            except (httpx.HTTPError, ValueError, AttributeError, TypeError):
                continue
            for candidate in found:
                if isinstance(candidate, str) and _has_tokenizer(candidate):
                    return candidate
    return next((m for m in argv_models if _has_tokenizer(m)), None)


def _argv_models(roles: list[RoleRecord]) -> list[str]:
    """The model and tokenizer paths on the workers' command lines, by each engine's own flags."""
    from muse_launch.engines import WORKER

    out = []
    for r in roles:
        worker = WORKER.get(r.engine)
        flags = (*worker.KEY_FLAGS.get("model", ()), *worker.TOKENIZER) if worker else ()
        argv = list(r.argv)
        out += [argv[argv.index(flag) + 1] for flag in flags if flag in argv[:-1]]
    return out


def target_of(
    record: DeploymentRecord,
    tokenizer: str | None,
    model: str | None,
    echo: Callable[[str], None],
    observe: Callable[[DeploymentRecord], DeploymentRecord],
) -> Target:
    """Everything bench needs of a running deployment, read through its URLs as its backend sees them now
    (`observe`: on Kubernetes, each pod's address); RuntimeFailure when it is not up."""
    from muse_launch.rundir.lifecycle import DeploymentState
    from muse_launch.smoke import list_models

    record = observe(record)
    if record.state is DeploymentState.STOPPED:
        raise RuntimeFailure(
            f"deployment {record.name!r} is not running", fix=f"muse-launch up {record.source} -d"
        )
    url = entry_url(record)
    generating = [r for r in record.roles if r.kind in GENERATING and r.url]
    workers = [_local(r.url) for r in record.roles if r.kind in WORKERS and r.url]
    with bounded_client(10.0, timeout=10.0) as client:
        if model is None:
            from muse_launch.engines import WORKER
            from muse_launch.engines.argv import last_value

            declared = tuple(
                n
                for r in generating
                if r.engine in WORKER and (n := last_value(r.argv, WORKER[r.engine].SERVED_MODEL_NAME))
            )
            model, listed = list_models(client, url, tuple(workers), declared)
            if model is None:
                raise RuntimeFailure(f"{record.name}: {listed.detail}", fix="name it with --model")
        if tokenizer is None:
            tokenizer = find_tokenizer(client, workers, _argv_models(list(record.roles)))
            if tokenizer is None:
                raise UsageError(
                    f"{record.name}: no worker names a local tokenizer directory (the load generator "
                    f"needs one, and bench fetches nothing from a hub)",
                    fix="give the model's directory with --tokenizer DIR",
                )
    if not _has_tokenizer(tokenizer):
        raise UsageError(
            f"--tokenizer {tokenizer}: not a directory with tokenizer files ({', '.join(TOKENIZER_FILES)})",
            fix="give the local directory of the model the workers serve",
        )
    gpus = sum(len(r.gpus) for r in record.roles if r.kind in WORKERS)
    roles = tuple(
        {"name": r.name, "kind": r.kind, "engine": r.engine, "gpus": list(r.gpus), "url": r.url}
        for r in record.roles
    )
    return Target(
        record.name,
        url,
        model,
        str(tokenizer),
        tuple(_local(r.url) + "/metrics" for r in generating),
        gpus,
        is_simulated(record),
        dict(record.versions),
        record.source,
        plan_digest(record),
        roles,
    )


def generated_tokens(client: httpx.Client, urls: tuple[str, ...]) -> float | None:
    """The engines' own count of tokens generated so far, summed; None where none reports it."""
    total, seen = 0.0, False
    for url in urls:
        try:
            text = client.get(url).text
        except httpx.HTTPError:
            continue
        values = [float(v) for v in GENERATION_COUNTER.findall(text)]
        if values:
            total, seen = total + sum(values), True
    return total if seen else None
