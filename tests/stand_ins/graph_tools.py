"""The outside parsers the graph tests check `plan --format mermaid|dot` with: mermaid's own parser under node
(scripts/install_graph_tools.sh puts it in ~/.cache/muse-launch/graph-tools) and graphviz's `dot`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from muse_launch.plan.spec import LaunchSpec, Plan

INSTALL = "bash scripts/install_graph_tools.sh"
_ENTITY = re.compile("\ufb02\u00b0\u00b0(\\d+)\u00b6\u00df")  # how mermaid keeps `#34;` until it draws it


def tools_dir() -> Path:
    return Path(os.environ.get("MUSE_LAUNCH_GRAPH_TOOLS", Path.home() / ".cache/muse-launch/graph-tools"))


def mermaid_parse(text: str) -> dict:
    """What mermaid's parser understood of `text`: {"ok", "vertices", "edges", "subgraphs"}, or
    {"ok": False, "error"}."""
    script = tools_dir() / "parse_mermaid.mjs"
    node = shutil.which("node")
    assert node and script.is_file() and (tools_dir() / "node_modules/mermaid").is_dir(), (
        f"mermaid's parser is not installed: run `{INSTALL}`"
    )
    ran = subprocess.run(
        [node, str(script)], input=text, capture_output=True, text=True, timeout=120, cwd=tools_dir()
    )
    assert ran.stdout.strip(), ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


def mermaid_decoded(text: str) -> str:
    """A label as mermaid will draw it: its entity codes decoded, `<br>` as a newline."""
    return _ENTITY.sub(lambda m: chr(int(m[1])), text).replace("<br>", "\n")


def dot_svg(text: str) -> subprocess.CompletedProcess:
    dot = shutil.which("dot")
    assert dot, f"graphviz is not installed: run `{INSTALL}`"
    return subprocess.run([dot, "-Tsvg"], input=text, capture_output=True, text=True, timeout=120)


# Everything that could end a label, start markup or a statement, in mermaid or DOT.
HOSTILE = 'x"];\nn9["pwn"] --> n0 %% end\\n #quot; <b>b</b> `md` {a|b} [c] (d) \\ ;'


def hostile_plan() -> Plan:
    specs = (
        LaunchSpec(
            name=f"prefill{HOSTILE}",
            role="prefill",
            kind="prefill",
            engine="sglang",
            launcher=("sglang",),
            args=("--disaggregation-transfer-backend", HOSTILE, "--host", "127.0.0.1", "--port", "30001"),
            gpus=(0,),
            node=f"node{HOSTILE}",
            host="127.0.0.1",
            ports={"http": 30001, "bootstrap": 8998},
        ),
        LaunchSpec(
            name="decode",
            role="decode",
            kind="decode",
            engine="sglang",
            launcher=("sglang",),
            args=("--encoder-transfer-backend", HOSTILE),
            host=HOSTILE,
            ports={"http": 30002},
            depends_on=("enc",),
        ),
        LaunchSpec(
            name="enc",
            role="enc",
            kind="encoder",
            engine="sglang",
            launcher=("sglang",),
            args=(),
            host="127.0.0.1",
            ports={"http": 30010},
        ),
        LaunchSpec(
            name="router",
            role="router",
            kind="router",
            engine="sglang-router",
            launcher=("r",),
            args=("--prefill", "http://127.0.0.1:30001", HOSTILE, "--decode", f"http://{HOSTILE}:30002"),
            host="127.0.0.1",
            ports={"http": 8000},
            depends_on=(f"prefill{HOSTILE}", "decode"),
        ),
    )
    return Plan(f"name{HOSTILE}", specs, (("enc", f"prefill{HOSTILE}"), ("decode",), ("router",)))
