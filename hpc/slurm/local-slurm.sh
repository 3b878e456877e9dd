#!/usr/bin/env bash
# A real Slurm cluster on one machine, whose nodes are the hosts of the shaped test bed (hpc/net/).
#
# munged, slurmctld and one slurmd per bed host (Debian's slurm-wlm 22.05 + munge), every file in one
# folder ($SINEW_SLURM_DIR, default /tmp/sinew-slurm): keys, configuration, state, spool, logs. Each slurmd
# runs in its host's network namespace (and a UTS namespace of its own, hostname sinew-hK), so that
# `sbatch -N 2` gets two hosts with their own addresses, and the MPI traffic of a job crosses the bed's
# shaped links. Slurm's own traffic goes over the bed's management network (mgmt0, 10.78.0.K): slurmctld
# runs in the root namespace at 10.78.0.254, on a veth into that network, so that sbatch, squeue, sacct
# and scontrol work from any shell of this machine with SLURM_CONF set (`eval "$(local-slurm.sh env)"`).
#
# Usage: local-slurm.sh up [N [RATE]]   start an N-node cluster (default 2 nodes, rate unlimited); brings
#                                       the test bed up with N hosts unless it has them. Idempotent: a
#                                       running cluster of N nodes is left alone, another one restarted.
#        local-slurm.sh down            stop the daemons and the jobs, remove the folder, and the bed if
#                                       `up` created it (safe when nothing runs)
#        local-slurm.sh status          daemons, nodes (sinfo), jobs (squeue); exit 1 if not up
#        local-slurm.sh env             the client environment, for eval: SLURM_CONF, and the MCA settings
#                                       that pin Open MPI to the bed's networks inside jobs
# Needs root (namespaces, daemons as root). The settings that mattered are explained next to them below
# and in docs/hpc.md.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
testbed=$here/../net/testbed.sh
dir=${SINEW_SLURM_DIR:-/tmp/sinew-slurm}
conf=$dir/etc/slurm.conf
ctl_addr=10.78.0.254 # slurmctld, in the root namespace, on the management network
ctl_if=sinew-slurm0  # its veth (the peer, sc0, is a port of the bed's management bridge)
ctl_port=${SINEW_SLURM_PORT:-6917}
slurmd_port=$((ctl_port + 1))

usage() { sed -n '12,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { echo "local-slurm: $*" >&2; }
die() { echo "local-slurm: error: $*" >&2; exit 1; }

need_root() {
  [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, and the Slurm daemons run as root)"
  local p
  for p in munged slurmctld slurmd sbatch sinfo; do
    command -v "$p" >/dev/null ||
      die "'$p' not found: install Debian's slurm-wlm and munge (mpi_scripts/setup.sh installs them)"
  done
}

nodes_up() { # the number of nodes of the running cluster, 0 if none
  [[ -f $dir/nodes ]] && pgrep -F "$dir/run/slurmctld.pid" >/dev/null 2>&1 && cat "$dir/nodes" || echo 0
}

client_env() {
  echo "export SLURM_CONF=$conf"
  # Inside a job: Open MPI's data over the bed's shaped eth0, PRRTE's daemons over mgmt0 (as
  # hpc/net/mpirun.sh does), no shared memory between the "hosts", and yield when idle (every host thinks
  # it owns all the cores; busy-polling ranks starve each other: a 1.3 s run took 46-151 s without).
  echo "export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=mgmt0"
  echo "export OMPI_MCA_mpi_yield_when_idle=1 PRTE_MCA_oob_tcp_if_include=mgmt0"
  # Jobs here run as root (the daemons do): let Open MPI's mpirun start as root.
  echo "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"
  echo "export PRTE_ALLOW_RUN_AS_ROOT=1 PRTE_ALLOW_RUN_AS_ROOT_CONFIRM=1"
}

write_conf() {
  local n=$1 short
  short=$(hostname -s)
  mkdir -p "$dir"/{etc,state,spool,log,run,tmp,munge}
  cat >"$conf" <<EOF
# Written by hpc/slurm/local-slurm.sh: an $n-node cluster on the test bed's hosts.
ClusterName=sinew
# "localhost" is refused; the address is on the bed's management network.
SlurmctldHost=$short($ctl_addr)
SlurmctldPort=$ctl_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A private munged; credentials expire after 5 s, so a requeued job may start again after seconds
# instead of ~121 s.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroup hierarchy of our own here: processes tracked by parentage, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# sacct without slurmdbd: the completion log (sacct -c).
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Node CPU counts from this file, whatever the machine has (a node here has more CPUs than cores).
SlurmdParameters=config_overrides
MpiDefault=none
TmpFS=$dir/tmp/%n
# Schedule at once: sbatch -> start in about a second, requeue -> start in seconds.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1
ReturnToService=2
KillWait=10
MinJobAge=3600
InactiveLimit=0
NodeName=sinew-h[1-$n] NodeAddr=10.78.0.[1-$n] CPUs=4 State=UNKNOWN
PartitionName=bed Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  local n=$1 rate=$2 k have
  have=$(ip netns list | awk '{print $1}' | grep -cE '^sinew-h[0-9]+$' || true)
  if ((have < n)); then
    "$testbed" up "$n" "$rate" >/dev/null
    touch "$dir.bed" # down removes the bed it created
  fi
  write_conf "$n"
  # The controller's address on the management bridge (removed with the bed's namespaces).
  if ! ip link show "$ctl_if" >/dev/null 2>&1; then
    ip link add "$ctl_if" type veth peer name sc0 netns sinew-br
    ip -n sinew-br link set sc0 master mg0 up
    ip addr add "$ctl_addr/24" dev "$ctl_if"
    ip link set "$ctl_if" up
  fi
  # munge: its own key, socket and files; --force because the folder belongs to root, not to munge.
  [[ -f $dir/munge/munge.key ]] || { dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none; }
  chmod 700 "$dir/munge" && chmod 400 "$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
  slurmctld -c -i -f "$conf" # -c: no saved state; -i: ignore errors in it
  for k in $(seq 1 "$n"); do
    mkdir -p "$dir/spool/sinew-h$k" "$dir/tmp/sinew-h$k"
    # nsenter, not `ip netns exec`: the latter remounts /sys, which hides the cgroup mount slurmd needs.
    nsenter --net="/run/netns/sinew-h$k" unshare --uts /bin/sh -c \
      'hostname "$0" && exec slurmd -f "$1" -N "$0"' "sinew-h$k" "$conf"
  done
  echo "$n" >"$dir/nodes"
  # Ready when every node is idle (slurmd registered).
  export SLURM_CONF=$conf
  local t0=$SECONDS
  until [[ $(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l) -ge $n ]]; do
    ((SECONDS - t0 < 30)) || { status >&2 || true; die "the nodes did not register within 30 s (logs: $dir/log)"; }
    sleep 0.2
  done
}

stop() {
  local f pid
  if [[ -f $conf ]] && pgrep -F "$dir/run/slurmctld.pid" >/dev/null 2>&1; then
    SLURM_CONF=$conf scancel --quiet --full --user=root 2>/dev/null || true
  fi
  for f in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/munge/munged.pid"; do
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  ip link del "$ctl_if" 2>/dev/null || true
  rm -rf "$dir"
  if [[ -f $dir.bed ]]; then
    "$testbed" down
    rm -f "$dir.bed"
  fi
}

status() {
  [[ $(nodes_up) -gt 0 ]] || { echo "local-slurm: not up"; return 1; }
  echo "local-slurm: $(nodes_up) nodes, folder $dir, SLURM_CONF=$conf"
  SLURM_CONF=$conf sinfo -N -o '%N %T %c' && SLURM_CONF=$conf squeue
}

case ${1:-} in
  up)
    need_root
    n=${2:-2} rate=${3:-unlimited}
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 64)) || die "N must be 1..64, got '$n'"
    t0=$(date +%s.%N)
    if [[ $(nodes_up) -eq $n ]]; then
      say "up already ($n nodes)"
    else
      stop
      start "$n" "$rate"
      say "up: $n nodes sinew-h1..sinew-h$n in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s; eval \"\$($0 env)\" for the clients"
    fi
    ;;
  down) need_root; stop ;;
  status) status ;;
  env) client_env ;;
  *) usage ;;
esac
