#!/usr/bin/env bash
# Every fault scenario (pytest marker `faults`): pid reuse, clock steps, escaped children, SIGSTOP, damaged
# state, full disks, planted symlinks, racing downs, log floods, port theft, hostile input, secrets...
# Prints a table of scenario, outcome and what each left alive (processes, ports): all zero when sound.
# Run after scripts/test.sh has installed the venv; extra arguments go to pytest (-k, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
if unshare -n true 2>/dev/null; then
  exec unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -m faults -q -p no:cacheprovider "$@"' sh "$@"
fi
exec .venv/bin/python -m pytest -m faults -q -p no:cacheprovider "$@"
