"""Regenerate muse_launch/export/schemas/ from the pinned CRDs (kubernetes-sigs/lws v0.10.0,
sgl-project/rbg v0.8.0-alpha.5; Apache-2.0): the openAPIV3Schema of the version `export`
writes, without descriptions, as compact JSON.

    python scripts/k8s_schemas.py DIR_WITH_CRDS
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

OUT = Path(__file__).resolve().parent.parent / "muse_launch" / "export" / "schemas"
PINNED = {
    "lws-v0.10.0-leaderworkersets.crd.yaml": ("v1", "leaderworkerset-v1.json", "kubernetes-sigs/lws v0.10.0"),
    "rbg-v0.8.0-alpha.5-rolebasedgroups.crd.yaml": (
        "v1alpha2",
        "rolebasedgroup-v1alpha2.json",
        "sgl-project/rbg v0.8.0-alpha.5",
    ),
}


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main(source: Path) -> None:
    for name, (version, out, origin) in PINNED.items():
        crd = yaml.safe_load((source / name).read_text())
        entry = next(v for v in crd["spec"]["versions"] if v["name"] == version)
        schema = strip(entry["schema"]["openAPIV3Schema"])
        schema["$comment"] = (
            f"{crd['spec']['group']}/{version} {crd['spec']['names']['kind']} from {origin}, {name}"
        )
        (OUT / out).write_text(json.dumps(schema, separators=(",", ":"), sort_keys=True) + "\n")
        print(f"{out}: {(OUT / out).stat().st_size} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/k8s_schemas.py DIR_WITH_CRDS (the lws and rbg CRDs)")
    main(Path(sys.argv[1]))
