"""`muse-launch schema` is what an editor validates against: it must accept our files and reject typos."""

import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from cli_run import muse

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "topologies").glob("*.yaml")) + sorted((ROOT / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def schema() -> dict:
    run = muse("schema")
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    jsonschema.Draft202012Validator.check_schema(out)
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_schema_accepts_every_shipped_topology(schema: dict, path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_schema_rejects_an_unknown_role_key(schema: dict) -> None:
    data = yaml.safe_load((ROOT / "topologies" / "epd-b300.yaml").read_text())
    data["roles"]["decode"]["gpu"] = [4]
    with pytest.raises(jsonschema.ValidationError, match="gpu"):
        jsonschema.validate(data, schema)


def test_schema_rejects_an_unknown_role_kind(schema: dict) -> None:
    data = yaml.safe_load((ROOT / "topologies" / "epd-b300.yaml").read_text())
    data["roles"]["router"]["kind"] = "balancer"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)
