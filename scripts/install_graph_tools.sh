#!/usr/bin/env bash
# What the tests of `plan --format mermaid|dot` need, from this repo's own files (idempotent):
#   graphviz (Debian's `dot`), which lays the dot output out as SVG, and node/npm where missing;
#   mermaid's own parser under node, pinned by scripts/graph_tools/package-lock.json, installed with
#   `npm ci` into $MUSE_LAUNCH_GRAPH_TOOLS (default ~/.cache/muse-launch/graph-tools). No browser.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dest="${MUSE_LAUNCH_GRAPH_TOOLS:-$HOME/.cache/muse-launch/graph-tools}"
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
apt_install() {  # Debian packages, the package lists refreshed once if a package is not found
  $sudo apt-get install -y -q "$@" >/dev/null \
    || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q "$@" >/dev/null; }
}
command -v dot >/dev/null || apt_install graphviz
command -v npm >/dev/null || apt_install nodejs npm  # mermaid 11 and jsdom 25 need node >= 18
files=("$here/graph_tools/package.json" "$here/graph_tools/package-lock.json" "$here/graph_tools/parse_mermaid.mjs")
stamp="$dest/.muse-launch-graph-tools.stamp"
want="$(cat "${files[@]}" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dest/node_modules/mermaid" ]; then exit 0; fi
mkdir -p "$dest"
cp "${files[@]}" "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
echo "$want" > "$stamp"
