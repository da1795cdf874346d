#!/usr/bin/env bash
# A headless Chromium for the test that opens bench's report.html in a real browser
# (tests/integration/test_bench_report_browser.py), from Debian's archive (idempotent):
# chromium-headless-shell (Chromium's headless build, ~110 MB with its libraries; no display needed).
# Prints the browser's path. MUSE_LAUNCH_CHROMIUM names another browser to use instead.
set -euo pipefail
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
found() {
  for b in "${MUSE_LAUNCH_CHROMIUM:-}" chromium-headless-shell /usr/lib/chromium/chromium-headless-shell \
    chromium chromium-browser google-chrome; do
    [ -n "$b" ] && command -v "$b" 2>/dev/null && return 0
  done
  return 1
}
found && exit 0
if ! command -v apt-get >/dev/null; then
  echo "install_browser.sh: no apt-get here; install Chromium and set MUSE_LAUNCH_CHROMIUM to it" >&2
  exit 1
fi
# the package lists refreshed once if the package is not found
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null \
  || { $sudo apt-get update -q >/dev/null \
    && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium-headless-shell >/dev/null; }
found
