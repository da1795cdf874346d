"""docs/topology.md is what scripts/docs_topology.py writes from `muse-launch schema`: never edited by
hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("docs_topology", REPO / "scripts" / "docs_topology.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_topology_reference_is_the_schema_regenerated() -> None:
    generator = _generator()
    text = generator.render(generator.schema())
    assert (REPO / "docs" / "topology.md").read_text() == text, (
        "docs/topology.md differs from the schema: run .venv/bin/python scripts/docs_topology.py"
    )
    assert generator.main([sys.argv[0], "--check"]) == 0


def test_every_key_of_the_schema_is_described() -> None:
    generator = _generator()
    doc = generator.schema()
    models = {"": doc, **doc["$defs"]}
    bare = [
        f"{name or 'top level'}.{key}"
        for name, model in models.items()
        for key, node in model.get("properties", {}).items()
        if not node.get("description") and key not in generator.NOTES.get(name, {})
    ]
    assert bare == [], "describe them in the schema (muse_launch/topology/model.py) or in NOTES"
    for line in (REPO / "docs" / "topology.md").read_text().splitlines():
        assert not line.endswith("|  |"), line  # a row with no description


def test_a_new_key_shows_in_the_reference() -> None:
    generator = _generator()
    doc = generator.schema()
    doc["properties"]["zz_new"] = {
        "type": "integer",
        "default": 3,
        "description": "a key added to the schema",
    }
    assert "| `zz_new` | integer | `3` | a key added to the schema |" in generator.render(doc)
