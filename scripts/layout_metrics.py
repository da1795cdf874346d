"""How the code is laid out, in figures that say where the next engineer loses time: lines of product code,
modules over 450 lines, functions over 60, `getattr` on engines and backends, the places that compose a
plan, and the path of `up` from a file to its supervisor (the modules it passes through, and how often it
goes back to one it had left). Run it on two checkouts to compare them:

    python scripts/layout_metrics.py            # this checkout
    python scripts/layout_metrics.py --json     # the same as JSON
    python scripts/layout_metrics.py --root ../other-checkout

The path of `up` is traced in a child process: `up --rehearse -d` of topologies/epd-b300.yaml (the README's;
no GPU, no engine), each call into muse_launch (not an import's module body) recorded until the supervisor
is forked, which is where `up` hands over; the fork is refused, so nothing starts. The checkout measured is
the one imported: run it with that checkout's Python (its venv) or PYTHONPATH."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = (
    Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
    if "--root" in sys.argv
    else Path(__file__).resolve().parents[1]
)
PACKAGE = ROOT / "muse_launch"
# a plan is composed where the pure builder is called outside plan/ itself
COMPOSES = re.compile(r"\bbuild_plan\(")
# getattr on an engine's module or a backend: what a typed object would answer
GETTERS = re.compile(r"getattr\(\s*(\w*(?:engine|backend|module|facts|mod)\w*)\b", re.IGNORECASE)

TRACE = r"""
import os, sys
seen = []
def hook(frame, event, arg):
    if event != "call":
        return
    name = frame.f_globals.get("__name__", "")
    if frame.f_code.co_name == "<module>":
        return
    if name.startswith("muse_launch") and (not seen or seen[-1] != name):
        seen.append(name)
def no_fork():
    sys.setprofile(None)
    print("\n".join(seen), file=open(os.environ["TRACE_OUT"], "w"))
    raise SystemExit(0)
os.fork = no_fork
sys.argv = ["muse-launch", "up", "topologies/epd-b300.yaml", "--rehearse", "-d"]
sys.setprofile(hook)
from muse_launch.cli import main
main()
"""


def product_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def static_figures() -> dict:
    lines, big, long_functions, getters, composers = 0, [], [], [], []
    for path in product_files():
        text = path.read_text()
        count = text.count("\n")
        lines += count
        rel = str(path.relative_to(ROOT))
        if count > 450:
            big.append(f"{rel} ({count})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > 60:
                    long_functions.append(f"{rel}:{node.name} ({length})")
        getters += [f"{rel}: {m[1]}" for m in GETTERS.finditer(text)]
        if not rel.startswith("muse_launch/plan/"):
            composers += [rel] * len(COMPOSES.findall(text))
    return {
        "product_lines": lines,
        "modules_over_450": big,
        "functions_over_60": long_functions,
        "getattr_on_engines_and_backends": getters,
        "places_that_compose_a_plan": sorted(set(composers)),
    }


def up_path() -> dict:
    with tempfile.TemporaryDirectory() as home:
        out = Path(home) / "trace"
        env = {**os.environ, "MUSE_LAUNCH_HOME": home, "TRACE_OUT": str(out), "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", TRACE], cwd=ROOT, env=env, capture_output=True, timeout=300)
        seen = out.read_text().split() if out.exists() else []
    packages = [".".join(m.split(".")[:2]) for m in seen]
    packages = [p for i, p in enumerate(packages) if i == 0 or packages[i - 1] != p]
    return {**_walk(seen), "packages": _walk(packages)}


def _walk(seen: list[str]) -> dict:
    left: set[str] = set()
    returns = 0
    for previous, module in zip(seen, seen[1:], strict=False):
        left.add(previous)
        returns += module in left
    moves = max(len(seen) - 1, 0)
    return {"modules": len(set(seen)), "transitions": moves, "returns_to_a_module_left": returns}


def main() -> None:
    figures = {**static_figures(), "up_path": up_path()}
    if "--json" in sys.argv:
        print(json.dumps(figures, indent=2))
        return
    print(f"lines of product code: {figures['product_lines']}")
    for key in ("modules_over_450", "functions_over_60", "getattr_on_engines_and_backends"):
        print(f"{key.replace('_', ' ')}: {len(figures[key])}")
        for item in figures[key]:
            print(f"  {item}")
    places = figures["places_that_compose_a_plan"]
    print(f"places that compose a plan: {len(places)}")
    for place in places:
        print(f"  {place}")
    path = figures["up_path"]
    print(
        f"up, from the file to its supervisor: {path['modules']} modules, {path['transitions']} moves "
        f"between them, {path['returns_to_a_module_left']} back to one it had left"
    )
    path = path["packages"]
    print(
        f"  by package: {path['modules']} packages, {path['transitions']} moves between them, "
        f"{path['returns_to_a_module_left']} back to one it had left"
    )


if __name__ == "__main__":
    main()
