#!/usr/bin/env bash
# Install SGLang 0.5.23 for the CPU (and mooncake's TCP transfer engine, and sglang-router) into a venv
# of its own, separate from the project's venv.
#
#   scripts/install_sglang_cpu.sh            # venv at ${MUSE_LAUNCH_SGLANG_VENV:-$HOME/.cache/muse-launch/sglang-cpu-venv}
#   MUSE_LAUNCH_SGLANG_VENV=/some/dir scripts/install_sglang_cpu.sh
#
# Idempotent: a stamp file in the venv records what was installed and patched; when it matches and
# the pinned versions are there, nothing is done. The last line printed on stdout is the venv's
# python path, so
#   SGLANG_PY=$(scripts/install_sglang_cpu.sh | tail -n1)
# works. Progress goes to stderr. From the registries and the local CPU torch wheel only.
#
# Every version is pinned in scripts/sglang_cpu/constraints.txt. What the CPU needs beyond the pins
# (measured: no registry ships a CPU sgl_kernel, and two pinned releases assume CUDA):
#   1. sgl_kernel: a pure-torch stand-in (scripts/sglang_cpu/sgl_kernel), enough for dense models;
#   2. torchvision 0.28.0 from PyPI is a CUDA build whose _C does not load on CPU torch: its two
#      unguarded fake-op registrations are guarded;
#   3. sglang's mooncake sender pins memory and records CUDA events for page indices: that fast
#      path is off when SGLANG_USE_CPU_ENGINE=1;
#   4. mooncake needs Debian's libibverbs1 (apt-get, when missing and root).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
VENV="${MUSE_LAUNCH_SGLANG_VENV:-$HOME/.cache/muse-launch/sglang-cpu-venv}"
PYTHON="${MUSE_LAUNCH_SGLANG_BASE_PYTHON:-python3.11}"
CONSTRAINTS="$HERE/sglang_cpu/constraints.txt"
STAND_IN="$HERE/sglang_cpu/sgl_kernel"
# sglang's own requirements pull CUDA builds; these are installed without their dependencies.
NO_DEPS=(sglang triton torchvision xgrammar compressed-tensors torch_memory_saver)
STAMP="$VENV/.muse-launch-sglang-cpu.stamp"
STAMP_CONTENT="$(sha256sum "$CONSTRAINTS" "$STAND_IN/__init__.py" "$0" | sha256sum | cut -c1-16) sglang==0.5.23 torch==2.13.0+cpu v1"

log() { echo "[install_sglang_cpu] $*" >&2; }
start=$(date +%s)

if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1'; then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        log "installing Debian's libibverbs1 (mooncake's transfer engine links it)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null \
            || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libibverbs1 >/dev/null; }
    else
        log "error: libibverbs.so.1 is missing (mooncake needs it): apt-get install libibverbs1"
        exit 1
    fi
fi

verify() {
    # Versions from metadata, the three patches and the stand-in; then the imports a server needs.
    SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" -W ignore - "$CONSTRAINTS" <<'PY'
import importlib.metadata as md, os, sys
want = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line and not line.startswith("#") and "==" in line:
        name, _, version = line.partition("==")
        want[name.lower().replace("_", "-")] = version
got = {d.metadata["Name"].lower().replace("_", "-"): d.version for d in md.distributions()}
bad = [f"{n}=={v} (found {got.get(n)})" for n, v in want.items() if got.get(n, "").split("+")[0] != v]
if bad:
    sys.exit("not as pinned: " + ", ".join(bad))
if got["torch"] != "2.13.0+cpu":
    sys.exit(f"torch is {got['torch']}, not the CPU build")
import sgl_kernel, sglang.srt.entrypoints.http_server, sglang.launch_server  # noqa: E401,F401
import mooncake.engine, sglang.srt.multimodal.processors.qwen_vl  # noqa: E401,F401
from sglang.srt.disaggregation.mooncake import conn
assert "muse-launch" in sgl_kernel.__version__, sgl_kernel.__file__
assert "SGLANG_USE_CPU_ENGINE" in open(conn.__file__).read(), "mooncake/conn.py is not patched"
print("sglang", md.version("sglang"), "| torch", got["torch"], "| sglang-router", md.version("sglang-router"),
      "| mooncake", md.version("mooncake-transfer-engine-non-cuda"))
PY
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" && -x "$VENV/bin/python" ]]; then
    if verify >/dev/null 2>&1; then
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
pip_() { "${PIP[@]}" "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2); }
FIND_LINKS=()
for d in ${PIP_FIND_LINKS:-} /opt/wheels; do
    [[ -d "$d" ]] && FIND_LINKS+=(--find-links "$d")
done
# Every pin of the constraints file, less torch (the local wheel, first) and the no-deps ones.
mapfile -t REST < <(grep -v '^#' "$CONSTRAINTS" | grep -v '^torch==' \
    | grep -viE "^($(IFS='|'; echo "${NO_DEPS[*]}" | sed 's/[-_]/[-_]/g'))==")
mapfile -t NODEPS_PINS < <(grep -iE "^($(IFS='|'; echo "${NO_DEPS[*]}" | sed 's/[-_]/[-_]/g'))==" "$CONSTRAINTS")

log "installing torch==2.13.0 (local CPU wheel)"
pip_ install -q "${FIND_LINKS[@]}" torch==2.13.0
"$VENV/bin/python" -W ignore -c 'import torch, sys; sys.exit(0 if "+cpu" in torch.__version__ else 1)' \
    || { log "error: torch in $VENV is not a CPU build"; exit 1; }
log "installing ${NODEPS_PINS[*]} (without their CUDA dependencies)"
pip_ install -q "${FIND_LINKS[@]}" --no-deps "${NODEPS_PINS[@]}"
log "installing ${#REST[@]} pinned dependencies (sglang-router, mooncake, transformers, ...)"
pip_ install -q "${FIND_LINKS[@]}" -c "$CONSTRAINTS" torch==2.13.0 "${REST[@]}"

SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
log "patching torchvision and sglang's mooncake sender for the CPU; installing the sgl_kernel stand-in"
sed -i 's/^@torch.library.register_fake("torchvision::\(q\?nms\)")/@(torch.library.register_fake("torchvision::\1") if torchvision.extension._has_ops() else (lambda f: f))/' \
    "$SP/torchvision/_meta_registrations.py"
sed -i 's/^    supports_host_tensor_indices = True$/    supports_host_tensor_indices = __import__("os").environ.get("SGLANG_USE_CPU_ENGINE") != "1"/' \
    "$SP/sglang/srt/disaggregation/mooncake/conn.py"
rm -rf "$SP/sgl_kernel"
cp -r "$STAND_IN" "$SP/sgl_kernel"

log "verifying pins and imports"
verify >&2
echo "$STAMP_CONTENT" > "$STAMP"
log "done in $(( $(date +%s) - start )) s; venv size $(du -sh "$VENV" | cut -f1)"
echo "$VENV/bin/python"
