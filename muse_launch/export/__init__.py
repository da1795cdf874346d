"""`muse-launch export`: a topology as LeaderWorkerSet or RoleBasedGroup manifests.

transform.py  the topology with Kubernetes DNS names for addresses, re-checked and re-planned,
              each role's ranks folded into leader/worker commands with LWS's or RBG's variables
manifests.py  the objects: LeaderWorkerSets + Services + the router's Deployment, or one RoleBasedGroup
validate.py   offline validation against the pinned CRD schemas and Kubernetes' own
expand.py     Kubernetes' $(VAR) expansion (templates are proven by expanding them back)
"""

from __future__ import annotations

from typing import Any

# Loaded on first use: the CLI imports commands/export.py for every command, and this package's
# modules import yaml, jsonschema and the planner.
_LAZY = {
    "build": "api",
    "export": "api",
    "check_dir": "api",
    "Exported": "api",
    "ExportError": "transform",
    "ExportPlan": "transform",
    "FLAVOURS": "names",
    "check_documents": "validate",
    "Problem": "validate",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
