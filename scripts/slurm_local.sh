#!/usr/bin/env bash
# A real SLURM cluster on this machine: Debian's munged, slurmctld and one ordinary slurmd per
# fake node (`slurmd -N nK`), each node with its own network address (NodeAddr=10.200.0.2, .3,
# ... on a veth pair the script adds and removes) so that two roles on two nodes can bind the
# same port, as on a real cluster, and fake GPUs
# (character devices under the cluster's directory, gres.conf File=) so that SLURM sets
# CUDA_VISIBLE_DEVICES for each step.
#
#   scripts/slurm_local.sh start [DIR]    install the packages if missing (apt-get), start; prints
#                                         `export SLURM_CONF=DIR/slurm.conf` for the client commands
#                                         (on failure, a command that fails: `eval` of it fails loudly)
#   scripts/slurm_local.sh stop [DIR]     cancel every job, stop the daemons it started (pid files),
#                                         kill what they left (slurmstepd, step processes), remove DIR
#   scripts/slurm_local.sh status [DIR]   daemons, nodes and jobs
#   scripts/slurm_local.sh install        only the packages (scripts/test.sh, before a test's `unshare -n`)
#
# Everything (config, keys, sockets, spool, logs, pid files, devices) lives under DIR
# (default: .slurm-local in the repository, or $MUSE_SLURM_DIR). Needs root (the daemons run as
# root) and nothing beyond loopback. Knobs: SLURM_LOCAL_NODES (3), SLURM_LOCAL_GPUS (8 per node),
# SLURM_LOCAL_PORT (6817: slurmctld; the slurmds take the next ones), SLURM_LOCAL_NET (10.200.0:
# node K is NET.(K+1)). Run it in a network namespace of its own (`unshare -n`, as the tests do)
# to leave the host's interfaces alone; the client commands then run in the same namespace.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
ACTION="${1:-status}"
DIR="${2:-${MUSE_SLURM_DIR:-$REPO/.slurm-local}}"
NODES="${SLURM_LOCAL_NODES:-3}"
GPUS="${SLURM_LOCAL_GPUS:-8}"
PORT="${SLURM_LOCAL_PORT:-6817}"
NET="${SLURM_LOCAL_NET:-10.200.0}"
LINK="msl$(printf '%s' "$DIR" | md5sum | cut -c1-8)"  # one veth pair per cluster directory
MARK="MUSE_SLURM_LOCAL=$DIR"  # in every daemon's environment, inherited by slurmstepd: finds them again

say() { echo "slurm_local: $*" >&2; }

install_packages() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v mknod >/dev/null || missing+=(coreutils)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get update -q >/dev/null ||
     ! apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
    say "error: could not install ${missing[*]} with apt-get (no network? \`unshare -n\` has none)"
    say "  fix: run \`bash scripts/slurm_local.sh install\` first, outside the namespace; start it inside"
    return 1
  fi
}

node_addr() { echo "$NET.$(( $1 + 1 ))"; }

write_config() {
  local host; host="$(hostname -s)"
  mkdir -p "$DIR"/{munge,run,log,state/ctld,dev}
  chmod 700 "$DIR" "$DIR/munge"
  {
    echo "# written by scripts/slurm_local.sh: a local cluster of $NODES fake nodes"
    echo "ClusterName=muselocal"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$DIR/munge/munge.socket"
    echo "StateSaveLocation=$DIR/state/ctld"
    echo "SlurmdSpoolDir=$DIR/state/%n"
    echo "SlurmctldPidFile=$DIR/run/slurmctld.pid"
    echo "SlurmdPidFile=$DIR/run/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "PlugStackConfig=$DIR/plugstack.conf"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core_Memory"
    echo "DefMemPerCPU=100"
    echo "SchedulerParameters=bf_interval=1"
    echo "SlurmdParameters=config_overrides"
    echo "ReturnToService=2"
    echo "MpiDefault=none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "JobCompType=jobcomp/none"
    echo "KillWait=5"
    echo "MinJobAge=600"
    echo "SlurmdTimeout=30"
    echo "GresTypes=gpu"
    for i in $(seq 1 "$NODES"); do
      echo "NodeName=n$i NodeAddr=$(node_addr "$i") Port=$(( PORT + i )) CPUs=16 RealMemory=16000 Gres=gpu:$GPUS State=UNKNOWN"
    done
    echo "PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } > "$DIR/slurm.conf"
  : > "$DIR/plugstack.conf"
  {
    echo "AutoDetect=off"
    for i in $(seq 1 "$NODES"); do
      mkdir -p "$DIR/dev/n$i"
      for g in $(seq 0 $(( GPUS - 1 ))); do
        [ -c "$DIR/dev/n$i/gpu$g" ] || mknod "$DIR/dev/n$i/gpu$g" c 1 3  # /dev/null's numbers: harmless
      done
      echo "NodeName=n$i Name=gpu File=$DIR/dev/n$i/gpu[0-$(( GPUS - 1 ))]"
    done
  } > "$DIR/gres.conf"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$DIR/munge/munge.key"
  fi
}

# The nodes' addresses (and NET.1 for the controller's side) on a veth pair: local addresses, so
# every daemon and role on this machine reaches them, and not loopback, so the plan's checks see
# a network like a real cluster's. It also gives a bare `unshare -n` the non-loopback IPv4
# address without which SLURM's getaddrinfo (AI_ADDRCONFIG) cannot resolve even 127.0.0.1.
add_addresses() {
  ip link show "$LINK" >/dev/null 2>&1 || ip link add "$LINK" type veth peer name "${LINK}p"
  echo "$LINK" > "$DIR/run/veth"
  local i
  for i in $(seq 0 "$NODES"); do
    ip addr replace "$(node_addr "$i")/24" dev "$LINK"
  done
  ip link set "$LINK" up
  ip link set "${LINK}p" up
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# The nodes' 10.200.0.x addresses belong in a network namespace of the caller's own, never on the
# host's network: refuse where any interface other than loopback and this script's veth pairs exists.
in_own_namespace() { ! ip -o link show | awk -F': ' '{print $2}' | grep -qvE '^(lo|msl[0-9a-f]{8}(p)?(@.*)?)$'; }

start() {
  install_packages
  if ! in_own_namespace && [ -z "${SLURM_LOCAL_HOST_NETWORK:-}" ]; then
    say "refusing to add node addresses ($NET.x) to this host's network; run it in a namespace of its own:"
    say "  unshare -n bash -c 'ip link set lo up; scripts/slurm_local.sh start; exec bash'"
    exit 2
  fi
  if pid_alive "$DIR/run/slurmctld.pid"; then
    say "already running in $DIR"
    echo "export SLURM_CONF=$DIR/slurm.conf"
    return 0
  fi
  write_config
  WROTE_CONFIG=1  # from here a failed start stops what it started (the EXIT trap below)
  add_addresses
  export SLURM_CONF="$DIR/slurm.conf"
  env "$MARK" munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
  env "$MARK" slurmctld -f "$SLURM_CONF"
  for i in $(seq 1 "$NODES"); do
    env "$MARK" slurmd -f "$SLURM_CONF" -N "n$i"
  done
  # Ready when every node is idle and a step runs.
  local deadline=$(( SECONDS + 60 ))
  until [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" -eq "$NODES" ]; do
    if [ $SECONDS -ge $deadline ]; then
      say "nodes not idle after 60 s:"; sinfo -N >&2 || true; tail -n 5 "$DIR"/log/*.log >&2 || true
      return 1
    fi
    sleep 0.2
  done
  say "$NODES nodes up (n1..n$NODES at $(node_addr 1)..$(node_addr "$NODES"), $GPUS GPUs each) in $DIR"
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

# Our processes: the pid files' daemons and anything carrying our mark (slurmstepd inherits it).
marked_pids() {
  local p
  for p in /proc/[0-9]*; do
    if { tr '\0' '\n' < "$p/environ"; } 2>/dev/null | grep -qxF "$MARK"; then echo "${p#/proc/}"; fi
  done
}

stop() {
  [ -d "$DIR" ] || { say "nothing at $DIR"; return 0; }
  export SLURM_CONF="$DIR/slurm.conf"
  if pid_alive "$DIR/run/slurmctld.pid"; then
    scancel --full --quiet $(squeue -h -o '%i' 2>/dev/null) 2>/dev/null || true
    local deadline=$(( SECONDS + 20 ))
    while [ -n "$(squeue -h -o '%i' 2>/dev/null)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  fi
  local f pids
  for f in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
    pid_alive "$f" && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  local deadline=$(( SECONDS + 10 ))
  while :; do
    pids="$(marked_pids)"
    for f in "$DIR"/run/*.pid; do pid_alive "$f" && pids="$pids $(cat "$f")"; done
    [ -z "${pids// /}" ] && break
    if [ $SECONDS -ge $deadline ]; then
      kill -KILL $pids 2>/dev/null || true
    fi
    sleep 0.2
  done
  if [ -f "$DIR/run/veth" ]; then ip link del "$(cat "$DIR/run/veth")" 2>/dev/null || true; fi
  rm -rf "$DIR"
  say "stopped; removed $DIR"
}

status() {
  export SLURM_CONF="$DIR/slurm.conf"
  local f
  for f in "$DIR"/run/*.pid; do
    [ -e "$f" ] || { say "not running ($DIR)"; return 1; }
    if pid_alive "$f"; then echo "$(basename "$f" .pid): pid $(cat "$f")"; else echo "$(basename "$f" .pid): dead"; fi
  done
  sinfo -N -o '%N %t %G' || true
  squeue -o '%i %j %T %N' || true
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

case "$ACTION" in
  # `eval "$(scripts/slurm_local.sh start)"` loses the exit status: on failure, stdout carries a command
  # that says so and fails: the eval (and a `set -e` shell) fails loudly, not leaving SLURM_CONF empty.
  # A start that fails half-way stops the daemons it started (munged, slurmctld...) and removes DIR.
  start) trap 'rc=$?; if [ "$rc" -ne 0 ]; then [ -z "${WROTE_CONFIG:-}" ] || stop >&2 || true
               echo "echo \"slurm_local: start failed (exit $rc); see above\" >&2; false"; fi' EXIT
         start ;;
  stop) stop ;;
  status) status ;;
  install) install_packages ;;
  *) echo "usage: $0 start|stop|status [DIR] | install" >&2; exit 2 ;;
esac
