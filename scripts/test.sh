#!/usr/bin/env bash
# Installs everything the tests need from this repo's own files, then runs the whole suite.
#   project venv (.venv) with the real sglang-router, vllm-router and smg;
#   vLLM on the CPU in its own venv (scripts/install_vllm_cpu.sh, idempotent);
#   the released sglang and vLLM argument parsers on the CPU (scripts/install_engine_parsers.sh, idempotent).
# Extra arguments go to pytest: `scripts/test.sh -m "not vllm_cpu"` for a quick local run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[routers,test]'
bash scripts/install_vllm_cpu.sh
bash scripts/install_engine_parsers.sh
exec .venv/bin/python -m pytest -ra "$@"
