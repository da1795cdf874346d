#!/usr/bin/env bash
# What the tests of `plan --format mermaid|dot` need, from this repo's own files (idempotent):
#   graphviz (Debian's `dot`), which lays the dot output out as SVG;
#   mermaid's own parser under node, pinned by scripts/graph_tools/package-lock.json, installed with
#   `npm ci` into $MUSE_LAUNCH_GRAPH_TOOLS (default ~/.cache/muse-launch/graph-tools). No browser.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${MUSE_LAUNCH_GRAPH_TOOLS:-$HOME/.cache/muse-launch/graph-tools}"
if ! command -v dot >/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get install -y -q graphviz >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q graphviz >/dev/null; }
fi
command -v node >/dev/null || { echo "install_graph_tools.sh: node is needed (Debian: apt-get install nodejs npm)" >&2; exit 1; }
stamp="$dest/.muse-launch-graph-tools.stamp"
want="$(sha256sum "$here/graph_tools/package-lock.json" "$here/graph_tools/parse_mermaid.mjs" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
mkdir -p "$dest"
cp "$here/graph_tools/package.json" "$here/graph_tools/package-lock.json" "$here/graph_tools/parse_mermaid.mjs" "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
echo "$want" > "$stamp"
