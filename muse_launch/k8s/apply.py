"""Server-side apply (field manager muse-launch, strict field validation), for real or as a dry run, and the
API server's refusals as `FILE: Kind/name: field.path: message` problems, as the offline check words them.

The Python client's DynamicClient.server_side_apply never sends fieldValidation, so the query rides on the
path. A dry run of a LeaderWorkerSet or RoleBasedGroup checks its own schema, CEL rules and webhooks, but not
its pod templates (a CRD's template is only a schema: the pods are validated when the controller makes them):
each template is therefore also sent as a dry-run Pod, so that the server's pod validation and admission
judge it now, and its problems are named at the template's path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from muse_launch.export.validate import KUSTOMIZATION, Problem, dotted, pod_templates

from .client import FIELD_MANAGER, REQUEST_TIMEOUT, Cluster, status_body

TYPED_PATCH = re.compile(r"failed to create typed patch object \([^)]*\): (\.\S+?): (.*)$", re.S)
UNKNOWN_FIELD = re.compile(r'(unknown|duplicate) field "([^"]+)"')
DENIED = re.compile(r'admission webhook "([^"]+)" denied the request: ([A-Za-z][\w.\[\]]*): (.*)$', re.S)
SEGMENT = re.compile(r"\.([^.\[]+)|\[([^\]]*)\]")
WORKLOADS = ("LeaderWorkerSet", "RoleBasedGroup")


def describe(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}"


def apply(cluster: Cluster, doc: dict[str, Any], dry_run: bool = False, namespace: str = "default") -> Any:
    """PATCH the object as an apply patch; raises the client's ApiException when the server refuses it."""
    res = cluster.resource(doc["apiVersion"], doc["kind"])
    ns = (doc["metadata"].get("namespace") or namespace) if res.namespaced else None
    query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")]
    if dry_run:
        query.append(("dryRun", "All"))
    path = res.path(name=doc["metadata"]["name"], namespace=ns) + "?" + urlencode(query)
    return cluster.dynamic.request(
        "patch",
        path,
        body=json.dumps(doc),
        content_type="application/apply-patch+yaml",
        _request_timeout=REQUEST_TIMEOUT,
    )


def dry_run_pod(cluster: Cluster, name: str, namespace: str, template: dict[str, Any]) -> Any:
    """A pod template as a Pod the server validates and admits, and stores nothing of."""
    meta = template.get("metadata") or {}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-check"[:63].rstrip("-"),
            "namespace": namespace,
            "labels": meta.get("labels") or {},
        },
        "spec": template.get("spec") or {},
    }
    path = f"/api/v1/namespaces/{namespace}/pods?" + urlencode(
        [("fieldValidation", "Strict"), ("dryRun", "All"), ("fieldManager", FIELD_MANAGER)]
    )
    return cluster.dynamic.request(
        "post", path, body=pod, content_type="application/json", _request_timeout=REQUEST_TIMEOUT
    )


def server_problems(
    cluster: Cluster, docs: Iterable[tuple[str, Any]], namespace: str = "default"
) -> list[Problem]:
    """Every object (and each workload's pod templates) through the server as a dry run."""
    from kubernetes.client.exceptions import ApiException

    from muse_launch.errors import UsageError

    problems: list[Problem] = []
    for file, doc in docs:
        if not isinstance(doc, dict) or (doc.get("apiVersion"), doc.get("kind")) == KUSTOMIZATION:
            continue
        obj = describe(doc)
        if (
            not isinstance(doc.get("metadata"), dict)
            or not doc["metadata"].get("name")
            or not doc.get("apiVersion")
        ):
            problems.append(Problem(file, obj, "", "apiVersion, kind and metadata.name are required"))
            continue
        try:
            apply(cluster, doc, dry_run=True, namespace=namespace)
        except UsageError as exc:  # a kind the cluster does not serve
            problems.append(Problem(file, obj, "", f"{exc} ({exc.fix})" if exc.fix else str(exc)))
            continue
        except ApiException as exc:
            problems += refusal(exc, file, obj, doc)
            continue
        if doc["kind"] not in WORKLOADS:
            continue
        ns = doc["metadata"].get("namespace") or namespace
        for at, template in pod_templates(doc):
            try:
                dry_run_pod(
                    cluster, doc["metadata"]["name"], ns, template if isinstance(template, dict) else {}
                )
            except ApiException as exc:
                problems += refusal(exc, file, obj, template, prefix=at, pod=True)
    return problems


def refusal(
    exc: Any, file: str, obj: str, doc: Any, prefix: tuple[Any, ...] = (), pod: bool = False
) -> list[Problem]:
    """The problems a refused request names, each at its field where the answer says which."""
    body = status_body(exc)
    message = str(body.get("message") or getattr(exc, "reason", "") or exc).strip()
    code = getattr(exc, "status", None)
    at = dotted(prefix)

    def where(field: str) -> str:
        field = field.lstrip(".")
        if pod and field.startswith("metadata.name"):
            field = "metadata.name"  # the check pod's own name: not the template's
        return f"{at}.{field}" if at and field else (at or field)

    causes = [
        c for c in (body.get("details") or {}).get("causes") or [] if isinstance(c, dict) and c.get("field")
    ]
    if causes:
        return [Problem(file, obj, where(c["field"]), str(c.get("message", "")).strip()) for c in causes]
    if m := TYPED_PATCH.search(message):
        return [Problem(file, obj, where(resolve(m.group(1), doc)), m.group(2).strip())]
    if unknown := UNKNOWN_FIELD.findall(message):
        return [
            Problem(file, obj, where(field), f"field not declared in schema ({kind} field)")
            for kind, field in unknown
        ]
    if m := DENIED.search(message):
        return [Problem(file, obj, where(m.group(2)), f"{m.group(3).strip()} (webhook {m.group(1)})")]
    if code == 404 and "namespaces" in message:
        return [
            Problem(
                file,
                obj,
                "metadata.namespace",
                f"{message} on the cluster: create it first (kubectl create namespace NAME)",
            )
        ]
    return [Problem(file, obj, at, f"HTTP {code}: {message}" if code else message)]


def resolve(path: str, doc: Any) -> str:
    """A structured-merge path (`.spec.containers[name="decode"].ports[containerPort=8000,protocol="TCP"]`)
    as the document's dotted path with list indexes (`spec.containers[0].ports[1]`)."""
    parts: list[Any] = []
    node = doc
    for key, selector in SEGMENT.findall(path):
        if key:
            parts.append(key)
            node = node.get(key) if isinstance(node, dict) else None
            continue
        index = _index(node, selector)
        parts.append(index if index is not None else f"[{selector}]")
        node = node[index] if index is not None else None
    return "".join(
        f"[{p}]" if isinstance(p, int) else (p if p.startswith("[") else f".{p}") for p in parts
    ).lstrip(".")


def _index(items: Any, selector: str) -> int | None:
    if not isinstance(items, list):
        return None
    if selector.isdigit():
        return int(selector)
    wanted = {}
    for pair in re.findall(r'([\w-]+)=("(?:[^"\\]|\\.)*"|[^,]*)', selector):
        key, raw = pair
        try:
            wanted[key] = json.loads(raw)
        except ValueError:
            wanted[key] = raw
    for i, item in enumerate(items):
        if isinstance(item, dict) and all(str(item.get(k)) == str(v) for k, v in wanted.items()):
            return i
    return None
