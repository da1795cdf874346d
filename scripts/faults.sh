#!/usr/bin/env bash
# Every fault scenario (pytest marker `faults`): pid reuse, clock steps, escaped children, SIGSTOP, damaged
# state, full disks, planted symlinks, racing downs, log floods, port theft, hostile input, secrets...
# Prints a table of scenario, outcome and what each left alive (processes, ports): all zero when sound.
# Installs what it needs first (the project and its test extra in .venv; idempotent, from the pip cache when
# there); extra arguments go to pytest (-k, -x).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -c 'import muse_launch, pytest, pytest_timeout, setproctitle' 2>/dev/null; then
  echo "faults.sh: installing the project and its test extra into .venv" >&2
  .venv/bin/python -m pip install -q -e '.[routers,test]'
fi
if unshare -n true 2>/dev/null; then
  exec unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -m faults -q -p no:cacheprovider "$@"' sh "$@"
fi
exec .venv/bin/python -m pytest -m faults -q -p no:cacheprovider "$@"
