#!/usr/bin/env bash
# Install the argument parsers of the released engines (sglang 0.5.23, vllm 0.33.0) into a venv of
# their own, on the CPU, for the engine check (`muse-launch validate --engine-check`) and its tests.
#
#   scripts/install_engine_parsers.sh   # venv at ${MUSE_LAUNCH_PARSERS_VENV:-$HOME/.cache/muse-launch/engine-parsers-venv}
#
# Idempotent: a stamp file in the venv records what was installed; when it matches and the parsers
# import, nothing is done. The last line on stdout is the venv's bin directory, so
#   PATH="$(scripts/install_engine_parsers.sh | tail -n1):$PATH"
# puts its `sglang` and `vllm` programs first, as an engine host has them. Progress goes to stderr.
#
# What goes in (checks/parser_runner.py drives these parsers):
#   torch==2.13.0          the CPU wheel that lies on these machines; never let pip resolve another
#                          (any other resolution downloads a multi-GB CUDA build)
#   sglang==0.5.23         --no-deps, plus the packages its server_args imports at module level
#   vllm==0.33.0           --no-deps, plus the requirements in its wheel metadata less the GPU ones
#                          (torch and its CUDA companions, NVIDIA, FlashInfer and kernel packages)
# Both live in one venv: their import-time needs do not conflict (transformers 5.19.0 suits both).
set -euo pipefail

VENV="${MUSE_LAUNCH_PARSERS_VENV:-$HOME/.cache/muse-launch/engine-parsers-venv}"
PYTHON="${MUSE_LAUNCH_PARSERS_BASE_PYTHON:-python3.11}"
TORCH_PIN="torch==2.13.0"
SGLANG_PIN="sglang==0.5.23"
VLLM_PIN="vllm==0.33.0"
# sglang.srt.server_args and what it imports at module level (its other requirements are GPU kernels
# or serving-time packages).
SGLANG_IMPORTS=(msgspec numpy orjson psutil pybase64 requests packaging pillow starlette typing_extensions
                triton pydantic pyzmq tqdm ipython aiohttp huggingface_hub "transformers==5.19.0")
# vLLM requirements that are GPU-only: torch and its companions (torch is pinned above), NVIDIA and
# ROCm kernels, FlashInfer, TVM/TileLang, video codecs.
VLLM_GPU_ONLY='^(torch|torchaudio|torchvision|torchcodec|nvidia-.*|cuda-.*|flashinfer.*|apache-tvm-ffi|tilelang|quack-kernels|tokenspeed-mla|humming-kernels|pynvvideocodec|nvtx|fastsafetensors|instanttensor|zentorch)$'
STAMP="$VENV/.muse-launch-engine-parsers.stamp"
STAMP_CONTENT="$TORCH_PIN $SGLANG_PIN $VLLM_PIN ${SGLANG_IMPORTS[*]} v1"

log() { echo "[install_engine_parsers] $*" >&2; }

# Both parsers build: the check the engine check itself relies on.
verify() {
    VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -W ignore - <<'PY'
import argparse, importlib.metadata as md, sys
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser(prog="sglang serve"); ServerArgs.add_cli_args(p)
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
root = FlexibleArgumentParser(prog="vllm"); subs = root.add_subparsers(dest="subcommand")
ServeSubcommand().subparser_init(subs)
import torch
assert "+cpu" in torch.__version__, torch.__version__
print("torch", torch.__version__, "| sglang", md.version("sglang"), "| vllm", md.version("vllm"),
      "| sglang flags", len(p._option_string_actions), file=sys.stderr)
PY
}

start=$(date +%s)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" && -x "$VENV/bin/python" ]]; then
    # Cheap check (building the parsers takes seconds): versions from metadata, a CPU torch, no CUDA companions.
    if "$VENV/bin/python" - >/dev/null 2>&1 <<'PY'
import importlib.metadata as md, importlib.util as u, sys
ok = (md.version("sglang") == "0.5.23" and md.version("vllm") == "0.33.0" and md.version("torch") == "2.13.0+cpu"
      and all(u.find_spec(m) for m in ("sglang", "vllm", "transformers", "triton"))
      and not any(u.find_spec(m) for m in ("torchvision", "torchaudio", "torchcodec")))
sys.exit(0 if ok else 1)
PY
    then
        log "already installed ($STAMP); nothing to do"
        echo "$VENV/bin"
        exit 0
    fi
    log "stamp present but the parsers do not build; reinstalling"
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
# pip's site config may list local indexes that lack most projects; hide that noise, and pip's
# complaint that the engines' GPU requirements are missing (they are left out on purpose).
pip_() {
    "${PIP[@]}" "$@" 2> >(grep -v -E 'is ignored: it is neither a file nor a directory|dependency resolver does not currently take into account|^(sglang|vllm) [0-9.]+ requires ' >&2)
}
FIND_LINKS=()
for d in ${PIP_FIND_LINKS:-} /opt/wheels; do
    [[ -d "$d" ]] && FIND_LINKS+=(--find-links "$d")
done

log "installing $TORCH_PIN (local CPU wheel)"
pip_ install -q "${FIND_LINKS[@]}" "$TORCH_PIN"
if ! "$VENV/bin/python" -W ignore -c 'import torch, sys; sys.exit(0 if "+cpu" in torch.__version__ else 1)' 2>/dev/null; then
    log "error: torch in $VENV is not a CPU build"
    exit 1
fi

log "installing $SGLANG_PIN and $VLLM_PIN without their dependencies"
pip_ install -q --no-deps "$SGLANG_PIN" "$VLLM_PIN"

log "reading vLLM's requirements from its wheel metadata (less the GPU-only ones)"
mapfile -t VLLM_REQS < <("$VENV/bin/python" - "$VLLM_GPU_ONLY" <<'PY'
import importlib.metadata as md, re, sys
from pip._vendor.packaging.requirements import Requirement
gpu_only = re.compile(sys.argv[1], re.I)
for text in md.requires("vllm") or ():
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # extras and other platforms
    if gpu_only.match(req.name):
        print(f"skip {req}", file=sys.stderr)
        continue
    print(str(req).split(";")[0].strip())
PY
)
log "installing ${#VLLM_REQS[@]} vLLM requirements and sglang's module-level imports"
# torch pinned in the same resolution, so that nothing can pull another build of it.
pip_ install -q "${FIND_LINKS[@]}" "$TORCH_PIN" "${VLLM_REQS[@]}" "${SGLANG_IMPORTS[@]}"

log "removing CUDA torch companions if anything pulled them in"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

log "verifying that both parsers build"
verify

echo "$STAMP_CONTENT" > "$STAMP"
log "done in $(( $(date +%s) - start )) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin"
