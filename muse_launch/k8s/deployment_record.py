"""A Kubernetes deployment's record in its run directory (k8s/deployment.json): where it runs (kubeconfig,
context, server, namespace), what `up` applied, and which pod is which role of the plan. `status`, `logs`,
`smoke` and `down` read it back; everything in it is checked before use (the run directory is hostile)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from muse_launch.errors import RuntimeFailure
from muse_launch.files import PlantedLink, read_nofollow, replace_file
from muse_launch.rundir.state import RunDir

KEYS = ("kubeconfig", "context", "server", "namespace", "flavour", "instance", "objects", "roles")


@dataclass
class K8sRecord:
    kubeconfig: str
    context: str
    server: str
    namespace: str
    flavour: str  # lws | rbg
    instance: str  # the app.kubernetes.io/instance label of every object and pod
    objects: list[dict[str, str]]  # apiVersion, kind, name: as applied, in order
    roles: list[dict[str, Any]]  # name, component, pod (None: a Deployment's pod), port, kind
    entry: dict[str, Any] = field(default_factory=dict)  # the router's Service: name, port
    rehearse: bool = False
    applied_at: float | None = None
    down_at: float | None = None
    # Instances a change is taking out of the router (drained, then deleted): `reconcile` leaves them out.
    leaving: list[str] = field(default_factory=list)
    images: dict[str, str] = field(default_factory=dict)  # `--image` as `up` had it: an edited file keeps it
    # The file it runs, as `up` or `up FILE` of an edited file took it: {"file", "sets"}.
    adopted: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def path(run_dir: RunDir) -> Path:
    return run_dir.path / "k8s" / "deployment.json"


def exists(run_dir: RunDir) -> bool:
    return path(run_dir).exists()


def write(run_dir: RunDir, record: K8sRecord) -> None:
    (run_dir.path / "k8s").mkdir(parents=True, exist_ok=True)
    replace_file(path(run_dir), record.to_json().encode(), root=run_dir.home)


def read(run_dir: RunDir) -> K8sRecord | None:
    try:
        data = json.loads(read_nofollow(path(run_dir), root=run_dir.home).decode())
    except FileNotFoundError:
        return None
    except (PlantedLink, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RuntimeFailure(
            f"{path(run_dir)}: damaged ({type(exc).__name__})",
            fix="remove it; the objects it named must then be deleted with kubectl",
        ) from None
    if (
        not isinstance(data, dict)
        or any(k not in data for k in KEYS)
        or not isinstance(data.get("objects"), list)
        or not isinstance(data.get("roles"), list)
    ):
        raise RuntimeFailure(f"{path(run_dir)}: not a deployment record (keys {', '.join(KEYS)})")
    known = set(K8sRecord.__dataclass_fields__)
    return K8sRecord(**{k: v for k, v in data.items() if k in known})
