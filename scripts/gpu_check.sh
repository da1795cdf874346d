#!/usr/bin/env bash
# GPUs as real as ports, on a real NVIDIA GPU host (what tests/integration/test_run_gpus.py fakes on the CPU):
#   0. what reading the GPUs costs `up` (import nvidia-ml-py, init, a full query), and GPU 0's baseline memory;
#   1. a command role holding GPU memory, with a setsid child and a SIGTERM-ignoring child holding some too:
#      `status` shows the role's GPU memory;
#   2. the supervisor SIGKILLed, then `down`: it says "GPU 0 free", and GPU 0's memory is back at its baseline;
#   3. a foreign process holding most of GPU 0, then `up` is refused before anything starts, naming it.
# Needs an installed muse-launch (PYTHON, default .venv/bin/python) and libcuda (any NVIDIA driver); no torch.
# Prints each step and its figures; exits 1 at the first step that fails.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
ML=("$PY" -m muse_launch)
WORK=$(mktemp -d)
export MUSE_LAUNCH_HOME=$WORK/home
unset MUSE_LAUNCH_GPU_VIEW
HOLD_GIB=${HOLD_GIB:-2}
FOREIGN_PID=
cleanup() {
  [ -n "$FOREIGN_PID" ] && kill -9 "$FOREIGN_PID" 2>/dev/null
  "${ML[@]}" down gpu-check >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok:   $*"; }
gpu0() {  # one figure of GPU 0 in the view `doctor --json` writes: used_gib | free_gib | holders
  "${ML[@]}" doctor --json | "$PY" -c '
import json, sys
gpu = json.load(sys.stdin)["gpu_view"]["gpus"][0]
used, free = gpu["used_bytes"] / 2**30, (gpu["total_bytes"] - gpu["used_bytes"]) / 2**30
print({"used_gib": f"{used:.2f}", "free_gib": f"{free:.2f}", "holders": " ".join(str(h["pid"]) for h in gpu["holders"])}[sys.argv[1]])' "$1"
}

echo "== 0. the host"
"${ML[@]}" doctor || fail "doctor"
"$PY" - <<'EOF' || exit 1
import time
t0 = time.perf_counter()
import pynvml
t1 = time.perf_counter()
pynvml.nvmlInit()
t2 = time.perf_counter()
pynvml.nvmlShutdown()
from muse_launch.host.gpus import read_gpu_view
view = read_gpu_view()
print(f"import pynvml {1000 * (t1 - t0):.0f} ms, nvmlInit {1000 * (t2 - t1):.0f} ms, "
      f"read_gpu_view (init, every GPU, holders, shutdown) {1000 * view.read_seconds:.0f} ms; "
      f"together {1000 * (t1 - t0 + view.read_seconds):.0f} ms, budget 100 ms")
if not view.available:
    raise SystemExit(f"FAIL: no GPU readable: {view.unavailable}")
EOF
HARDWARE=$("$PY" -c '
from muse_launch.host.gpus import read_gpu_view
from muse_launch.topology.hardware import PROFILES
name = read_gpu_view().gpus[0].name
print(next((p.name for p in PROFILES.values() if p.matches_gpu(name)), ""))')
[ -n "$HARDWARE" ] || fail "GPU 0 matches no hardware profile; steps 1-3 need one (topology/hardware.py)"
BASELINE=$(gpu0 used_gib)
PORT=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "hardware profile $HARDWARE; GPU 0 baseline: $BASELINE GiB used"

cat >"$WORK/gpu-check.yaml" <<EOF
version: 1
name: gpu-check
hardware: $HARDWARE
roles:
  holder:
    kind: command
    command: [$PY, scripts/gpu_hold.py, --gib, "$HOLD_GIB", --port, "{port}", --setsid-child, --stubborn-child]
    port: $PORT
    gpus: [0]
    mem_fraction: 0.1
    ready: {http: /health, timeout: 120}
    stop: {grace: 3}
EOF

echo "== 1. a role holding GPU memory, with a setsid child and a SIGTERM-ignoring child"
"${ML[@]}" up "$WORK/gpu-check.yaml" --detach || fail "up"
"${ML[@]}" status gpu-check
HELD=$("${ML[@]}" status gpu-check --json | "$PY" -c '
import json, sys
held = json.load(sys.stdin)["roles"][0]["gpu_memory"]["total_bytes"] / 2**30
print(f"{held:.2f}")')
echo "status: the role holds $HELD GiB (3 processes x $HOLD_GIB GiB, plus each one's CUDA context)"
"$PY" -c "import sys; sys.exit(not float('$HELD') >= 3 * float('$HOLD_GIB'))" \
  && pass "status shows the role's GPU memory, its escaped children's included" \
  || fail "status shows $HELD GiB for the role, less than 3 x $HOLD_GIB"

echo "== 2. the supervisor SIGKILLed, then down"
SUPERVISOR=$("${ML[@]}" status gpu-check --json | "$PY" -c 'import json, sys; print(json.load(sys.stdin)["supervisor_pid"])')
kill -9 "$SUPERVISOR"
START=$(date +%s.%N)
DOWN=$("${ML[@]}" down gpu-check); RC=$?
echo "$DOWN"
echo "down took $("$PY" -c "print(f'{$(date +%s.%N) - $START:.2f}')") s"
[ $RC -eq 0 ] || fail "down exited $RC"
grep -q "^GPU 0 free$" <<<"$DOWN" || fail "down did not say GPU 0 free"
AFTER=$(gpu0 used_gib)
echo "GPU 0: $AFTER GiB used after down (baseline $BASELINE)"
"$PY" -c "import sys; sys.exit(not float('$AFTER') <= float('$BASELINE') + 0.25)" \
  && pass "GPU 0 memory back at its baseline at once" || fail "GPU 0 still has $AFTER GiB used"

echo "== 3. a foreign process holding most of GPU 0, then up"
FREE=$(gpu0 free_gib)
FOREIGN_GIB=$("$PY" -c "print(f'{$FREE - 4:.1f}')")
CUDA_VISIBLE_DEVICES=0 CUDA_DEVICE_ORDER=PCI_BUS_ID "$PY" scripts/gpu_hold.py --gib "$FOREIGN_GIB" \
  --ready-file "$WORK/foreign" &
FOREIGN_PID=$!
disown "$FOREIGN_PID"  # killed on exit, without the shell reporting it
for _ in $(seq 600); do [ -e "$WORK/foreign" ] && break; sleep 0.1; done
[ -e "$WORK/foreign" ] || fail "the foreign holder did not get $FOREIGN_GIB GiB"
START=$(date +%s.%N)
UP=$("${ML[@]}" up "$WORK/gpu-check.yaml" --detach 2>&1); RC=$?
echo "$UP"
echo "up refused in $("$PY" -c "print(f'{$(date +%s.%N) - $START:.2f}')") s"
[ $RC -eq 1 ] || fail "up exited $RC, not 1"
grep -q "GPU 0: .* GiB held by pid $FOREIGN_PID (" <<<"$UP" || fail "up did not name pid $FOREIGN_PID"
grep -q "fix: " <<<"$UP" || fail "no fix: line"
[ -z "$(gpu0 holders | tr ' ' '\n' | grep -v "^$FOREIGN_PID$")" ] || fail "something else holds GPU 0 now"
"$PY" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1)" 2>/dev/null && fail "the role's port answers"
pass "up refused before anything started, naming the holder"
echo "all GPU checks passed"
