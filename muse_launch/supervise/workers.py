"""A router's worker set while it runs, and a worker's own in-flight count.

sglang-router and smg take workers added (`POST /workers`, with the worker type and a prefill's bootstrap
port) and removed (`DELETE /workers/{id}`) at run time, and keep only their command-line workers across a
restart; so the supervisor holds the set each router should list (its wiring check's wires) and
`reconcile` makes the router's list that set. Removing a worker from a router stops new requests to it,
not the ones in flight: those end on the worker, whose own metrics (`in_flight`) tell when it is idle.
Every answer read here is bounded and checked (muse_launch/bounded_json.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

from muse_launch.bounded_json import load_answer
from muse_launch.engines import ROUTERS, router
from muse_launch.engines.metrics import ENGINE_METRICS, METRICS_PATH
from muse_launch.errors import RuntimeFailure
from muse_launch.supervise.probe import HTTP_TIMEOUT
from muse_launch.supervise.wiring import Wire, WiringCheck


class RouterRefused(RuntimeFailure):
    """The router answered a change of its worker set with something else than success."""


def adds_workers(engine: str) -> bool:
    facts = ROUTERS.get(engine)
    return facts is not None and facts.adds_workers


def _api(check: WiringCheck) -> str:
    return check.list_url.rsplit("/", 1)[0] + router.WORKER_API


TRANSPORT_TRIES = 3  # a router call whose connection broke (a stale pooled one) goes again on a new one


def _again(send: Callable[[], httpx.Response]) -> httpx.Response:
    """`send` (an idempotent call: a GET, a DELETE that takes 404, a POST that takes 409), once more on a
    fresh connection where the transport failed; the last failure is raised."""
    for attempt in range(TRANSPORT_TRIES):
        try:
            return send()
        except httpx.TransportError:
            if attempt == TRANSPORT_TRIES - 1:
                raise
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")


def _ids(client: httpx.Client, check: WiringCheck) -> dict[str, str]:
    answer = _again(lambda: client.get(_api(check), headers=check.headers, timeout=HTTP_TIMEOUT))
    if answer.status_code != 200:
        raise RouterRefused(f"GET {_api(check)} answered {answer.status_code}")
    return router.worker_ids(load_answer(answer.content))


def register(client: httpx.Client, check: WiringCheck, wire: Wire) -> None:
    """Add one worker to the router, as the worker type it serves and with its bootstrap port."""
    body = router.worker_entry(wire.kind, wire.url, wire.bootstrap_port)
    answer = _again(lambda: client.post(_api(check), json=body, headers=check.headers, timeout=HTTP_TIMEOUT))
    if answer.status_code not in (200, 201, 202, 409):  # 409: smg already holds (or drains) it
        raise RouterRefused(f"POST {_api(check)} ({wire.peer}) answered {answer.status_code}")


def deregister(client: httpx.Client, check: WiringCheck, url: str) -> bool:
    """Remove the worker at `url` from the router; False where it did not list it."""
    wid = _ids(client, check).get(url.rstrip("/"))
    if wid is None:
        return False
    answer = _again(
        lambda: client.delete(f"{_api(check)}/{wid}", headers=check.headers, timeout=HTTP_TIMEOUT)
    )
    if answer.status_code not in (200, 202, 204, 404):
        raise RouterRefused(f"DELETE {_api(check)}/{wid} answered {answer.status_code}")
    return True


def reconcile(client: httpx.Client, check: WiringCheck) -> list[str]:
    """Make the router list exactly `check.wires`: what it lacks is added, what it should not hold is
    removed (a router restarted on its first command line lists workers scaled away since). Returns what
    it did, one line each."""
    listed = _ids(client, check)
    wanted = {w.url.rstrip("/"): w for w in check.wires}
    done = []
    for url, wire in wanted.items():
        if url not in listed:
            register(client, check, wire)
            done.append(f"registered {wire.kind} {wire.peer} ({wire.url})")
    for url in sorted(set(listed) - set(wanted)):
        deregister(client, check, url)
        done.append(f"removed {url}, which it should no longer hold")
    return done


_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(?P<value>\S+)")


def running_in(text: str, metric: str) -> int | None:
    """The sum of a gauge's samples in a Prometheus text answer; None where it holds none."""
    total, seen = 0.0, False
    for line in text.splitlines()[:100_000]:
        m = _SAMPLE.match(line)
        if m and m["name"] == metric:
            try:
                value = float(m["value"])
            except ValueError:
                continue
            if value == value and 0 <= value < 1e9:  # NaN or nonsense from a hostile answer: ignored
                total += value
                seen = True
    return round(total) if seen else None


def in_flight(client: httpx.Client, engine: str, url: str) -> int | None:
    """Requests the worker itself counts as in flight (running until their last token, or waiting); None
    where it does not say. Its scheduler's own load endpoint where it has one and it answers (SGLang's
    /v1/loads, asked of the scheduler at each call), else its /metrics gauges (SGLang serves them only with
    --enable-metrics, and sets them only when a batch runs: an idle prefill keeps its last batch's count, so
    a drain that trusted them would wait out its bound)."""
    metrics = ENGINE_METRICS.get(engine)
    if metrics is None:
        return None
    if metrics.load_path and (loaded := loaded_in_flight(client, url, metrics.load_path)) is not None:
        return loaded
    return gauged_in_flight(client, url, metrics.running, metrics.queued)


def gauged_in_flight(client: httpx.Client, url: str, running: str, queued: str) -> int | None:
    """Running plus waiting by the worker's /metrics gauges; None where it serves none."""
    try:
        answer = client.get(url.rstrip("/") + METRICS_PATH, timeout=HTTP_TIMEOUT)
    except httpx.HTTPError:
        return None
    if answer.status_code != 200 or len(answer.content) > 8 << 20:
        return None
    count = running_in(answer.text, running)
    return None if count is None else count + (running_in(answer.text, queued) or 0)


def loaded_in_flight(client: httpx.Client, url: str, path: str, timeout: float = HTTP_TIMEOUT) -> int | None:
    """Running plus waiting by the worker's load endpoint; None where it does not answer in `timeout`."""
    try:
        answer = client.get(url.rstrip("/") + path, timeout=timeout)
        return load_in(load_answer(answer.content)) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def load_in(answer: object) -> int | None:
    """Running plus waiting over a load answer's entries: SGLang 0.5.23's /v1/loads (`{"loads": [...]}`,
    `num_running_reqs`) or an older /get_load entry (`num_reqs`); None for anything else."""
    if isinstance(answer, dict) and isinstance(answer.get("loads"), list):
        answer = answer["loads"]
    entries = answer if isinstance(answer, list) else [answer]

    def count(value: object) -> int | None:
        return (
            value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 30 else None
        )

    total, seen = 0, False
    for entry in entries[:1024]:
        if not isinstance(entry, dict):
            return None
        running = count(entry.get("num_running_reqs"))
        running = count(entry.get("num_reqs")) if running is None else running  # one or the other, not both
        if running is not None:
            total, seen = total + running, True
        total += count(entry.get("num_waiting_reqs")) or 0
    return total if seen else None
