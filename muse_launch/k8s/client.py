"""One connection to a cluster through the official `kubernetes` client (the `k8s` extra), from a kubeconfig
($KUBECONFIG, else ~/.kube/config) and an optional context. Every request names its own timeout."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from muse_launch.errors import MissingDependency, RuntimeFailure, UsageError

FIELD_MANAGER = "muse-launch"
REQUEST_TIMEOUT = 30.0  # seconds for one API call; a loaded API server answers well within it


def _import():
    try:
        from kubernetes import client, config, dynamic  # noqa: F401
    except ModuleNotFoundError as exc:
        raise MissingDependency(
            f"Kubernetes needs the kubernetes client ({exc.name} is not installed): "
            f"pip install 'muse-launch[k8s]'"
        ) from exc
    return client, config, dynamic


@dataclass
class Cluster:
    """The API client, a dynamic client for any kind, and where it came from (for the run's record)."""

    api: Any  # kubernetes.client.ApiClient
    dynamic: Any  # kubernetes.dynamic.DynamicClient
    context: str
    server: str
    kubeconfig: str

    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def resource(self, api_version: str, kind: str) -> Any:
        from kubernetes.dynamic.exceptions import ResourceNotFoundError

        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            raise UsageError(
                f"the cluster at {self.server} serves no {kind} ({api_version})",
                fix=_install_hint(api_version),
            ) from None

    def close(self) -> None:
        self.api.close()


def _install_hint(api_version: str) -> str:
    if api_version.startswith("leaderworkerset.x-k8s.io"):
        return "install the LeaderWorkerSet controller (kubernetes-sigs/lws), or export --to rbg"
    if api_version.startswith("workloads.x-k8s.io"):
        return "install the RoleBasedGroup controller (sgl-project/rbg), or export --to lws"
    return "check the cluster's version and its CRDs"


def kubeconfig_path() -> str:
    first = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
    return first or str(Path.home() / ".kube" / "config")


def connect(context: str | None = None, kubeconfig: str | None = None) -> Cluster:
    """A client for `context` (default: the kubeconfig's current one); a clear error where there is none."""
    client, config, dynamic = _import()
    path = kubeconfig or kubeconfig_path()
    if not Path(path).is_file():
        raise UsageError(
            f"no kubeconfig at {path}",
            fix="set KUBECONFIG to your cluster's kubeconfig "
            '(for a local one: eval "$(scripts/k8s_local.sh start)")',
        )
    try:
        contexts, current = config.list_kube_config_contexts(config_file=path)
        chosen = context or (current or {}).get("name")
        if context and context not in [c["name"] for c in contexts]:
            raise UsageError(
                f"--context {context}: not in {path}; contexts: {', '.join(c['name'] for c in contexts)}"
            )
        configuration = client.Configuration()
        config.load_kube_config(config_file=path, context=chosen, client_configuration=configuration)
    except (config.ConfigException, ValueError, OSError) as exc:
        raise UsageError(f"{path}: cannot use it as a kubeconfig: {exc}") from None
    api = client.ApiClient(configuration)
    try:
        dyn = dynamic.DynamicClient(api)
    except Exception as exc:  # discovery: the server does not answer, or refuses the credentials
        api.close()
        raise RuntimeFailure(
            f"the cluster at {configuration.host} (context {chosen}) does not answer: {_reason(exc)}",
            fix="check that it runs and that the kubeconfig's credentials are valid",
        ) from None
    return Cluster(api, dyn, chosen or "", configuration.host, path)


def _reason(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if body:
        return status_message(body) or str(getattr(exc, "reason", exc))
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__


def status_message(body: Any) -> str:
    """The `message` of an API server's Status answer, else the body's first line."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        data = json.loads(body)
        return str(data.get("message") or body)
    except (ValueError, TypeError, AttributeError):
        return str(body).strip().splitlines()[0][:300] if str(body).strip() else ""


def status_body(exc: BaseException) -> dict[str, Any]:
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        data = json.loads(body) if body else {}
        return data if isinstance(data, dict) else {}
    except (ValueError, TypeError):
        return {"message": str(body)[:300]}
