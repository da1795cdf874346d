"""Ready means wired: a role's own probe says it serves, not that its peers found it.

sglang-router's /readiness is 200 once one prefill and one decode are in, and an SGLang language
worker is healthy with none of its encoders reachable. So besides each role's probe, `up` waits
until each router lists every worker the file gives it as healthy, and each SGLang language
worker's encoder list holds every encoder the file wires to it (facts: engines/router.py,
engines/sglang.py ENCODER_LIST_PATH).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from muse_launch.addresses import connect_host
from muse_launch.bounded_json import load_answer
from muse_launch.engines import ROUTER_ENGINES, ROUTERS, router, worker_facts
from muse_launch.plan.spec import Plan
from muse_launch.supervise.probe import HTTP_TIMEOUT, base_url

ROUTED_KINDS = ("prefill", "decode", "worker")


@dataclass(frozen=True)
class Wire:
    peer: str  # the role instance expected at the other end
    kind: str  # prefill | decode | worker | encoder
    url: str  # the peer's URL, as the file wires it
    bootstrap_port: int | None = None  # a prefill's KV bootstrap port: what a router registers it with


@dataclass(frozen=True)
class WiringResult:
    missing: tuple[Wire, ...]
    seen: str  # what the latest look at the list observed


@dataclass(frozen=True)
class WiringCheck:
    """Where a role lists its peers (a router's workers, a language worker's encoders), and which it
    should."""

    role: str
    list_url: str
    wires: tuple[Wire, ...]
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # a router's key: never printed

    def check(self, client: httpx.Client) -> WiringResult:
        try:
            answer = client.get(self.list_url, timeout=HTTP_TIMEOUT, headers=self.headers)
            listed = _listed(load_answer(answer.content)) if answer.status_code == 200 else None
        except httpx.TimeoutException:
            return WiringResult(self.wires, f"GET {self.list_url}: no answer within {HTTP_TIMEOUT:g}s")
        except (httpx.HTTPError, ValueError) as e:
            return WiringResult(self.wires, f"GET {self.list_url}: {type(e).__name__}")
        if listed is None:
            refused = (
                ""
                if answer.status_code != 401
                else " (the router refuses the --api-key it was given)"
                if self.headers
                else " (it wants a key: give the router --api-key in its args)"
            )
            return WiringResult(self.wires, f"GET {self.list_url} answered {answer.status_code}{refused}")
        missing = tuple(w for w in self.wires if not listed.get(w.url.rstrip("/"), False))
        return WiringResult(
            missing, "wired" if not missing else "missing " + ", ".join(w.url for w in missing)
        )

    def counts(self, missing: tuple[Wire, ...]) -> tuple[tuple[str, int, int], ...]:
        """(kind, listed, expected) for each kind of peer, in the order the file gives them."""
        absent = set(missing)
        kinds = list(dict.fromkeys(w.kind for w in self.wires))
        return tuple(
            (
                k,
                sum(1 for w in self.wires if w.kind == k and w not in absent),
                sum(1 for w in self.wires if w.kind == k),
            )
            for k in kinds
        )

    def failure(self, missing: tuple[Wire, ...], timeout: float) -> str:
        what = "the router's worker list" if self.wires[0].kind in ROUTED_KINDS else "its encoder list"
        peers = "; ".join(f"{w.kind} {w.peer} at {w.url}" for w in missing)
        state = "as healthy " if what.startswith("the router") else ""
        return f"not wired after {timeout:g}s: {what} (GET {self.list_url}) does not hold {state}{peers}"


def _listed(answer: object) -> dict[str, bool]:
    if isinstance(answer, dict) and isinstance(answer.get("encoder_urls"), list):
        return {str(u).rstrip("/"): True for u in answer["encoder_urls"]}
    return router.listed_workers(answer)


def wiring_checks(plan: Plan, hosts: Mapping[str, str] | None = None) -> dict[str, WiringCheck]:
    """The wiring each role of the plan must show before the deployment counts as ready; `hosts`: where each
    role is reached (its record's probe host: on SLURM, its node), else where it binds."""
    specs = {s.name: s for s in plan.specs}
    checks: dict[str, WiringCheck] = {}
    for spec in plan.specs:
        peers = [specs[d] for d in spec.depends_on if d in specs and specs[d].url]
        headers: dict[str, str] = {}
        if spec.engine in ROUTER_ENGINES and spec.ports.get("http"):
            wires = tuple(
                Wire(p.name, p.kind, p.url, p.ports.get("bootstrap")) for p in peers if p.kind in ROUTED_KINDS
            )
            path = ROUTERS[spec.engine].workers_path
            port = spec.ports["http"]
            headers = router.auth_headers(spec.argv)
        elif (
            (facts := worker_facts(spec.engine))
            and facts.encoder_list_path
            and spec.ports.get("encoder_bootstrap")
        ):
            wires = tuple(Wire(p.name, "encoder", p.url) for p in peers if p.kind == "encoder")
            path = facts.encoder_list_path
            port = spec.ports["encoder_bootstrap"]
        else:
            continue
        if wires:
            host = (hosts or {}).get(spec.name) or connect_host(spec.bind)
            checks[spec.name] = WiringCheck(spec.name, base_url(host, port) + path, wires, headers)
    return checks
