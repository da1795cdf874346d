#!/usr/bin/env bash
# Everything the SGLang-on-CPU examples need, in one idempotent command:
#
#   eval "$(bash scripts/sglang_cpu_setup.sh)"
#   muse-launch up examples/epd-sglang-cpu.yaml
#
# 1. scripts/install_sglang_cpu.sh: SGLang 0.5.23 for the CPU in its own venv
#    (${MUSE_LAUNCH_SGLANG_VENV:-$HOME/.cache/muse-launch/sglang-cpu-venv}; a no-op when installed);
# 2. scripts/make_tiny_vl_model.py: the tiny offline Qwen2.5-VL (it serves text and images), written once
#    to ${MUSE_LAUNCH_SGLANG_MODEL_DIR:-$HOME/.cache/muse-launch/tiny-qwen-vl} (kept when present).
#
# Stdout carries only the two lines for eval:
#   export MUSE_LAUNCH_SGLANG_PYTHON=<venv python>   (the examples' launcher)
#   export MUSE_LAUNCH_SGLANG_MODEL=<model dir>       (the examples' model)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
model_dir="${MUSE_LAUNCH_SGLANG_MODEL_DIR:-$HOME/.cache/muse-launch/tiny-qwen-vl}"
log() { echo "[sglang_cpu_setup] $*" >&2; }

python="$(bash "$here/install_sglang_cpu.sh" | tail -n1)"
if [[ -z "$python" || ! -x "$python" ]]; then
    log "error: install_sglang_cpu.sh did not name an executable python (got: '${python}')"
    exit 1
fi
model_path="$("$python" "$here/make_tiny_vl_model.py" "$model_dir" 2>/dev/null | tail -n1)"
if [[ -z "$model_path" || ! -f "$model_path/config.json" ]]; then
    log "error: make_tiny_vl_model.py did not write a model to $model_dir"
    exit 1
fi
log "SGLang python: $python"
log "tiny model:    $model_path"
printf 'export MUSE_LAUNCH_SGLANG_PYTHON=%q\n' "$python"
printf 'export MUSE_LAUNCH_SGLANG_MODEL=%q\n' "$model_path"
