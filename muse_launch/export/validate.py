"""Offline validation of exported (or hand-edited) manifests, without a cluster.

- LeaderWorkerSet and RoleBasedGroup against the pinned CRD schemas (schemas/, from
  kubernetes-sigs/lws v0.10.0 and sgl-project/rbg v0.8.0-alpha.5), strictly: an unknown field
  is an error wherever the schema does not say `x-kubernetes-preserve-unknown-fields`;
- their metadata and pod templates (a RoleBasedGroup leader's with its patch applied), and every
  core object (Service, Deployment, ...), against Kubernetes' own schemas, strictly
  (the `kubernetes-validate` package's, for KUBERNETES_VERSION);
- the names the API server checks that a schema does not: objects, containers, ports.

Each problem reads `FILE: Kind/name: field.path: message`. CEL rules are not evaluated.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .manifests import LWS_API, RBG_API

KUBERNETES_VERSION = "1.33"
SCHEMAS = Path(__file__).parent / "schemas"
CRDS = {
    (LWS_API, "LeaderWorkerSet"): "leaderworkerset-v1.json",
    (RBG_API, "RoleBasedGroup"): "rolebasedgroup-v1alpha2.json",
}
KUSTOMIZATION = ("kustomize.config.k8s.io/v1beta1", "Kustomization")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")


@dataclass(frozen=True)
class Problem:
    file: str
    obj: str  # Kind/name
    path: str
    message: str

    def __str__(self) -> str:
        return self.format()

    def format(self, directory: Path | None = None) -> str:
        file = directory / self.file if directory else self.file
        return f"{file}: {self.obj}: {self.path or '(object)'}: {self.message}"


def dotted(parts: Iterable[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def strict(schema: Any) -> Any:
    """Unknown fields rejected wherever the structural schema lists its fields and does not
    preserve unknown ones."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@cache
def _crd_validator(file: str) -> jsonschema.Validator:
    schema = strict(json.loads((SCHEMAS / file).read_text()))
    return jsonschema.Draft7Validator(schema)


@cache
def _core_registry():
    import importlib.resources

    from referencing import Registry, Resource

    root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    folder = root / f"v{KUBERNETES_VERSION}.0-local-strict"
    definitions = json.loads((folder / "_definitions.json").read_text())
    return folder, Resource.from_contents(definitions) @ Registry()


@cache
def _core_validator(ref: str) -> jsonschema.Validator | None:
    """`ref`: a definition (io.k8s.api.core.v1.PodTemplateSpec) or a file of kubernetes-validate's."""
    folder, registry = _core_registry()
    if ref.endswith(".json"):
        path = folder / ref
        if not path.is_file():
            return None
        schema = json.loads(path.read_text())
    else:
        schema = {"$ref": f"https://kubernetes.io/api/_definitions.json#/$defs/{ref}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _core_file(api_version: str, kind: str) -> str:
    group, _, version = api_version.rpartition("/")
    group = group.split(".")[0]
    return f"{kind.lower()}-{group + '-' if group else ''}{version}.json"


def _errors(
    validator: jsonschema.Validator, data: Any, at: tuple[Any, ...], file: str, obj: str
) -> Iterator[Problem]:
    for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        leaves = error.context if error.context and error.validator in ("anyOf", "oneOf") else None
        if leaves:  # an anyOf's own message quotes the whole value; its alternatives say what is wrong
            best = jsonschema.exceptions.best_match(leaves)
            yield Problem(file, obj, dotted((*at, *error.absolute_path, *best.relative_path)), best.message)
        else:
            yield Problem(file, obj, dotted((*at, *error.absolute_path)), error.message)


def validate_object(data: Any, file: str) -> list[Problem]:
    if not isinstance(data, dict):
        return [Problem(file, "?", "", "a Kubernetes object is a mapping with apiVersion, kind and metadata")]
    api, kind = data.get("apiVersion"), data.get("kind")
    name = (data.get("metadata") or {}).get("name") if isinstance(data.get("metadata"), dict) else None
    obj = f"{kind or '?'}/{name or '?'}"
    if not isinstance(api, str) or not isinstance(kind, str):
        return [Problem(file, obj, "", "apiVersion and kind are required")]
    if (api, kind) == KUSTOMIZATION:
        return []  # checked with the directory
    problems: list[Problem] = []
    crd = CRDS.get((api, kind))
    if crd:
        problems += _errors(_crd_validator(crd), data, (), file, obj)
        meta = _core_validator("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        if isinstance(data.get("metadata"), dict):
            problems += _errors(meta, data["metadata"], ("metadata",), file, obj)
        template = _core_validator("io.k8s.api.core.v1.PodTemplateSpec")
        for at, pod in pod_templates(data):
            problems += _errors(template, pod, at, file, obj)
    else:
        validator = _core_validator(_core_file(api, kind))
        if validator is None:
            known = ", ".join(f"{a} {k}" for a, k in CRDS)
            return [
                Problem(file, obj, "", f"no schema for {api} {kind}: export writes {known} and core kinds")
            ]
        problems += _errors(validator, data, (), file, obj)
    if not problems:
        problems += _names(data, file, obj)
    return problems


def pod_templates(data: dict[str, Any]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """The pod templates of a LeaderWorkerSet or RoleBasedGroup, as their controllers build pods from them."""
    spec = data.get("spec") or {}
    if data.get("kind") == "LeaderWorkerSet":
        lwt = spec.get("leaderWorkerTemplate") or {}
        for key in ("leaderTemplate", "workerTemplate"):
            if key in lwt:
                yield ("spec", "leaderWorkerTemplate", key), lwt[key]
    elif data.get("kind") == "RoleBasedGroup":
        for i, role in enumerate(spec.get("roles") or []):
            if not isinstance(role, dict):
                continue
            if "template" in (role.get("standalonePattern") or {}):
                yield (
                    ("spec", "roles", i, "standalonePattern", "template"),
                    role["standalonePattern"]["template"],
                )
            lwp = role.get("leaderWorkerPattern") or {}
            if "template" in lwp:
                at = ("spec", "roles", i, "leaderWorkerPattern")
                yield (*at, "template"), lwp["template"]
                if lwp.get("leaderTemplatePatch"):
                    yield (
                        (*at, "leaderTemplatePatch"),
                        merge_patch(lwp["template"], lwp["leaderTemplatePatch"]),
                    )
                if lwp.get("workerTemplatePatch"):
                    yield (
                        (*at, "workerTemplatePatch"),
                        merge_patch(lwp["template"], lwp["workerTemplatePatch"]),
                    )


MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "ports": "containerPort",
    "volumes": "name",
    "volumeMounts": "mountPath",
}


def merge_patch(base: Any, patch: Any, key: str | None = None) -> Any:
    """A strategic merge patch, for the pod fields RBG's template patches touch: lists of
    containers, env, ports, volumes and mounts merge by their key; other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            out[k] = merge_patch(out[k], v, k) if k in out else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        field = MERGE_KEYS[key]
        out = copy.deepcopy(base)
        for item in patch:
            index = next(
                (
                    i
                    for i, b in enumerate(out)
                    if isinstance(b, dict) and isinstance(item, dict) and b.get(field) == item.get(field)
                ),
                None,
            )
            if index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = merge_patch(out[index], item)
        return out
    return copy.deepcopy(patch)


def _names(data: dict[str, Any], file: str, obj: str) -> list[Problem]:
    """What the API server's name validation would refuse."""
    out = []
    kind, name = data["kind"], data["metadata"].get("name", "")
    pattern, what = {
        "Service": (DNS_1035, "a DNS-1035 label (a letter first)"),
        "LeaderWorkerSet": (DNS_1035, "a DNS-1035 label: it names the set's Service"),
    }.get(kind, (DNS_SUBDOMAIN, "a DNS-1123 subdomain"))
    limit = 253 if pattern is DNS_SUBDOMAIN else 63
    if not pattern.match(name) or len(name) > limit:
        out.append(
            Problem(file, obj, "metadata.name", f"{name!r} is not {what} of at most {limit} characters")
        )
    for at, pod in (
        pod_templates(data)
        if kind in ("LeaderWorkerSet", "RoleBasedGroup")
        else [(("spec", "template"), (data.get("spec") or {}).get("template") or {})]
    ):
        for i, c in enumerate(((pod or {}).get("spec") or {}).get("containers") or []):
            where = (*at, "spec", "containers", i)
            if not DNS_LABEL.match(c.get("name", "")):
                out.append(
                    Problem(file, obj, dotted((*where, "name")), f"{c.get('name')!r} is not a DNS label")
                )
            for j, p in enumerate(c.get("ports") or []):
                if "name" in p and (not PORT_NAME.match(p["name"]) or len(p["name"]) > 15):
                    out.append(
                        Problem(
                            file,
                            obj,
                            dotted((*where, "ports", j, "name")),
                            f"{p['name']!r} is not a port name (at most 15 of a-z, 0-9 and '-', a letter)",
                        )
                    )
            for j, e in enumerate(c.get("env") or []):
                if not ENV_NAME.match(e.get("name", "")):
                    out.append(
                        Problem(
                            file,
                            obj,
                            dotted((*where, "env", j, "name")),
                            f"{e.get('name')!r} is not a valid environment variable name",
                        )
                    )
    if kind == "Deployment":
        selector = ((data.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        labels = (((data.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            out.append(
                Problem(
                    file, obj, "spec.selector.matchLabels", "does not match spec.template.metadata.labels"
                )
            )
    if kind == "RoleBasedGroup":
        roles = [r.get("name") for r in (data.get("spec") or {}).get("roles") or [] if isinstance(r, dict)]
        for i, role in enumerate((data.get("spec") or {}).get("roles") or []):
            for j, dep in enumerate(role.get("dependencies") or []):
                if dep not in roles:
                    out.append(
                        Problem(
                            file,
                            obj,
                            dotted(("spec", "roles", i, "dependencies", j)),
                            f"{dep!r} is not a role of this group; roles: {', '.join(map(str, roles))}",
                        )
                    )
    return out


def read_dir(directory: Path) -> tuple[list[tuple[str, Any]], list[Problem]]:
    """Every document of every *.yaml / *.yml in the directory (kustomization.yaml's resources first)."""
    docs: list[tuple[str, Any]] = []
    problems: list[Problem] = []
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    for path in files:
        try:
            for doc in yaml.safe_load_all(path.read_text()):
                if doc is not None:
                    docs.append((path.name, doc))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path.name}:{mark.line + 1}" if mark else path.name
            problems.append(
                Problem(where, "?", "", f"not valid YAML: {getattr(exc, 'problem', None) or exc}")
            )
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(path.name, "?", "", f"cannot read: {exc}"))
    return docs, problems


def check_documents(docs: list[tuple[str, Any]], present: Iterable[str]) -> list[Problem]:
    problems: list[Problem] = []
    seen: dict[tuple[str, str], str] = {}
    present = set(present)
    kustomized = False
    for file, doc in docs:
        problems += validate_object(doc, file)
        if isinstance(doc, dict) and (doc.get("apiVersion"), doc.get("kind")) == KUSTOMIZATION:
            kustomized = True
            for i, resource in enumerate(doc.get("resources") or []):
                if resource not in present:
                    problems.append(
                        Problem(
                            file, "Kustomization", f"resources[{i}]", f"{resource!r} is not in this directory"
                        )
                    )
            listed = set(doc.get("resources") or [])
            for other in sorted(present - listed - {file}):
                problems.append(Problem(file, "Kustomization", "resources", f"{other} is not listed; add it"))
        elif isinstance(doc, dict) and isinstance(doc.get("metadata"), dict):
            key = (str(doc.get("kind")), str(doc["metadata"].get("name")))
            if key in seen:
                problems.append(Problem(file, "/".join(key), "metadata.name", f"also defined in {seen[key]}"))
            seen.setdefault(key, file)
    unique: dict[tuple[str, str, str], Problem] = {}  # a CRD's pod schema and Kubernetes' may both object
    for p in problems:
        unique.setdefault((p.file, p.obj, p.path), p)
    problems = list(unique.values())
    if docs and not kustomized:
        problems.append(
            Problem("kustomization.yaml", "Kustomization", "", "missing: list the manifests in it")
        )
    return problems


def check_dir_problems(directory: Path) -> tuple[list[Problem], bool]:
    """The problems of every manifest in a directory; True when a file does not read as YAML."""
    docs, unreadable = read_dir(directory)
    present = [p.name for p in directory.iterdir() if p.suffix in (".yaml", ".yml")]
    return unreadable + check_documents(docs, present), bool(unreadable)
