#!/usr/bin/env bash
# What the tests of `plan --format mermaid|dot` need, from this repo's own files (idempotent):
#   graphviz (Debian's `dot`), which lays the dot output out as SVG;
#   mermaid's own parser under node, pinned by scripts/graph_tools/package-lock.json, installed with
#   `npm ci` into $MUSE_LAUNCH_GRAPH_TOOLS (default ~/.cache/muse-launch/graph-tools). No browser.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${MUSE_LAUNCH_GRAPH_TOOLS:-$HOME/.cache/muse-launch/graph-tools}"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
if ! command -v dot >/dev/null; then
  $sudo apt-get install -y -q graphviz >/dev/null \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q graphviz >/dev/null; }
fi
if ! command -v node >/dev/null; then
  echo "install_graph_tools.sh: node is needed (Debian: apt-get install nodejs npm)" >&2
  exit 1
fi
files=("$here/graph_tools/package.json" "$here/graph_tools/package-lock.json" "$here/graph_tools/parse_mermaid.mjs")
stamp="$dest/.muse-launch-graph-tools.stamp"
want="$(cat "${files[@]}" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dest/node_modules/mermaid" ]; then exit 0; fi
mkdir -p "$dest"
cp "${files[@]}" "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
echo "$want" > "$stamp"
