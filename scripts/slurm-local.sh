#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, to try `--executor slurm` for real (docs/validation.md).
#
#   sudo scripts/slurm-local.sh up     # install slurmctld, slurmd, slurm-client, munge if missing,
#                                      # write a one-node slurm.conf for this host (its cores and
#                                      # memory; partition "debug"; no accounting database), start
#                                      # munged, slurmctld, slurmd, wait until the node is idle
#   sudo scripts/slurm-local.sh down   # stop the three daemons
#   scripts/slurm-local.sh status      # sinfo
#
# Needs root on a Debian-like machine (apt-get). Environment: E2MC_SLURM_CONF (the slurm.conf to
# write; /etc/slurm/slurm.conf), E2MC_SLURM_WAIT_S (seconds to wait for the node; 60).
# A slurm.conf that this script did not write is never overwritten.
set -euo pipefail

CONF=${E2MC_SLURM_CONF:-/etc/slurm/slurm.conf}
WAIT_S=${E2MC_SLURM_WAIT_S:-60}
MARK="# written by e2mc scripts/slurm-local.sh"
HOST=$(hostname -s)

say() { echo "slurm-local: $*" >&2; }
die() { say "error: $*"; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts daemons)"; }

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sinfo >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  [ ${#missing[@]} -eq 0 ] && return
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  local wait=(-o DPkg::Lock::Timeout=300)  # another apt-get may hold the lock for a while
  apt-get "${wait[@]}" update -qq
  apt-get "${wait[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_conf() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; not touching it"
  fi
  local cpus mem_mb
  cpus=$(nproc --all)
  # all the memory but 512 MiB for the system (at least 512 MiB)
  mem_mb=$(awk '/^MemTotal:/ {m = int($2 / 1024) - 512; if (m < 512) m = 512; print m}' /proc/meminfo)
  mkdir -p "$(dirname "$CONF")" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/slurm
  chown slurm:slurm /var/spool/slurmctld /var/log/slurm 2>/dev/null || true
  cat >"$CONF" <<EOF
$MARK
ClusterName=e2mc-local
SlurmctldHost=$HOST
SlurmUser=slurm
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
KillWait=30
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$HOST CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
  chown slurm:slurm /run/slurm 2>/dev/null || true
  say "wrote $CONF: node $HOST, $cpus CPUs, $mem_mb MiB, partition debug"
}

running() {  # a live process of that exact name (a zombie left by a killed daemon is none)
  local pid
  for pid in $(pgrep -x "$1" || true); do
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] && return 0
  done
  return 1
}

start_munge() {
  if running munged; then return; fi
  if [ ! -s /etc/munge/munge.key ]; then
    if command -v mungekey >/dev/null; then mungekey --create --keyfile /etc/munge/munge.key
    else dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; fi
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
}

up() {
  need_root
  install_packages
  write_conf
  start_munge
  running slurmctld || slurmctld -f "$CONF"
  running slurmd || slurmd -f "$CONF"
  local start=$SECONDS state=""  # wall time: an sinfo without a controller may take seconds
  while [ $((SECONDS - start)) -lt "$WAIT_S" ]; do
    state=$(timeout 5 sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1 || true)
    case "$state" in
      idle|mixed|allocated) say "node $HOST is $state after $((SECONDS - start)) s"; sinfo
                            return 0 ;;
      down*|drain*) timeout 5 scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  die "node $HOST not idle after $WAIT_S s (state: ${state:-no answer}); see /var/log/slurm/"
}

stop_one() {  # the pid file's process, else the daemon of that exact name
  local name=$1 pidfile=$2 pid=""
  [ -f "$pidfile" ] && pid=$(cat "$pidfile")
  [ -z "$pid" ] && pid=$(pgrep -x "$name" || true)
  [ -n "$pid" ] || return 0
  kill $pid 2>/dev/null || true
  for _ in $(seq 30); do kill -0 $pid 2>/dev/null || return 0; sleep 0.5; done
  say "$name ($pid) still running after 15 s"
}

down() {
  need_root
  if command -v scancel >/dev/null && timeout 5 sinfo >/dev/null 2>&1; then
    timeout 10 scancel --full --quiet -u "$(id -un)" 2>/dev/null || true
  fi
  stop_one slurmd /run/slurm/slurmd.pid
  stop_one slurmctld /run/slurm/slurmctld.pid
  stop_one munged /run/munge/munged.pid
  say "stopped"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) sinfo ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
