#!/usr/bin/env bash
# Installs everything the tests need from this repo's own files, then runs the whole suite, in two tiers:
#   fast tier (about a minute): `ruff check`, then the unit tests; they need the project venv only, so they
#     run before the long installs and a break shows at once;
#   long tier: every other test, every marker, after installing
#     vLLM on the CPU in its own venv (scripts/install_vllm_cpu.sh, idempotent);
#     the released sglang and vLLM argument parsers on the CPU (scripts/install_engine_parsers.sh, idempotent);
#     Debian's SLURM and munge (scripts/slurm_local.sh install; the `slurm` tests start a local cluster).
# Extra arguments go to pytest in both tiers: `scripts/test.sh -m "not vllm_cpu"` for a quick local run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[routers,test]'

# The tests run in a network namespace of their own: their ports never meet another program's, and
# the local SLURM cluster's node addresses stay inside it (no network is needed past the installs).
pytest_isolated() {
  if unshare -n true 2>/dev/null; then
    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -ra "$@"' sh "$@"
  else
    echo "test.sh: cannot create a network namespace (unshare -n needs root); the slurm tests will refuse" >&2
    .venv/bin/python -m pytest -ra "$@"
  fi
}

echo "test.sh: fast tier: ruff check, unit tests" >&2
.venv/bin/ruff check .
pytest_isolated tests/unit "$@"

echo "test.sh: long tier: installs, then every other test" >&2
bash scripts/install_vllm_cpu.sh
bash scripts/install_engine_parsers.sh
bash scripts/slurm_local.sh install  # munge, slurmctld, slurmd, slurm-client (apt-get) for the `slurm` tests
pytest_isolated --ignore=tests/unit "$@"
