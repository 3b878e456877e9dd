#!/usr/bin/env bash
# Runs an MPI program on the test bed, one rank per host: ranks 0..N-1 on sinew-h1..sinew-hN.
#
# Usage: mpirun.sh N [mpirun options...] -- PROGRAM [ARGS...]     (without `--`: everything is the program)
#   e.g. hpc/net/mpirun.sh 4 -- build/apps/sinew-bench allreduce --max-bytes 67108864
#        mpirun.sh --as-mpirun MPIRUN-ARGUMENTS...   (as mpirun itself: the caller gives -n and the hosts,
#        --host 10.77.0.K:S,... or --hostfile F; for launchers such as sinew-supervise --mpirun)
# SINEW_BED_SLOTS=S (default 1): S ranks per host, ranks 0..S-1 on sinew-h1, S..2S-1 on sinew-h2, ...
#
# mpirun runs inside sinew-h1 (as host 1): the root namespace has no route to the bed's networks, and
# PRRTE's daemons must call back to mpirun over one of them. Rank 0 is started by mpirun itself; the other hosts'
# daemons (prted) come through hpc/net/rsh-agent.sh. All MPI traffic (btl tcp) is pinned to
# eth0, so it crosses the shaped links; the shared-memory transport is off since the ranks are "remote".
# PRRTE's own traffic (oob) goes over the management network (mgmt0), as on a cluster: a cut of the data
# network (testbed.sh cut/partition) leaves the launcher able to report a process that died.
# Every host believes it owns all the machine's cores, so Open MPI does not see that the ranks share them
# and busy-polls while it waits; the polling ranks then starve each other (a 4-host training step took 69
# ms instead of 29 ms, unshaped). mpi_yield_when_idle=1, which Open MPI sets itself when it knows a node
# is oversubscribed, gives the cores back; SINEW_BED_YIELD=0 turns it off (e.g. one core per host).
#
# Messages up to 4 MiB go eagerly (btl_tcp_eager_limit; Open MPI's default is 64 KiB): above the limit each
# message waits for a rendezvous reply, and on a shaped link that reply queues behind the data already in
# the receiver's outgoing queue (tens of ms at 100 Mbit/s). ByteGrad's all-to-all exchange went from 181 to
# 102 ms per step, our ring allreduce from 89 % to 95 % of the line rate. SINEW_BED_EAGER=0 keeps the default.
#
# Tear-down: this script only uses the bed, it never creates or removes it. A driver that brings the bed up
# removes it on every exit path, success or failure, with a trap set right after `up`:
#     hpc/net/testbed.sh up 4 1gbit
#     trap 'hpc/net/testbed.sh down' EXIT
#     hpc/net/mpirun.sh 4 -- ...      # a failing run (set -e) or a Ctrl-C still runs the trap
# `testbed.sh down` also stops any process left in the namespaces (a rank of a crashed run), so no
# namespace outlives the driver.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../mpi_scripts/env.sh"

n=${1:-}
[[ $n == --as-mpirun || $n =~ ^[0-9]+$ ]] && [[ $n != 0 ]] || { sed -n '4,8p' "$0" | sed 's/^# //' >&2; exit 2; }
shift
slots=${SINEW_BED_SLOTS:-1}
[[ $slots =~ ^[1-9][0-9]*$ ]] || { echo "error: SINEW_BED_SLOTS must be a whole number >= 1, got '$slots'" >&2; exit 2; }
mpi_args=()
if [[ $n == --as-mpirun ]]; then
  mpi_args=("$@")  # -n, the hosts and the program: all the caller's
  set --
elif [[ " $* " == *" -- "* ]]; then
  while [[ $1 != -- ]]; do mpi_args+=("$1"); shift; done
  shift
fi
flags=("${SINEW_MPIRUN_FLAGS[@]}")
if [[ $n != --as-mpirun ]]; then
  [[ $# -ge 1 ]] || { echo "error: no program given" >&2; exit 2; }
  h=$(((n + slots - 1) / slots))
  ip netns list | grep -qE "^sinew-h$h( |$)" ||
    { echo "error: the bed has fewer than $h hosts; run hpc/net/testbed.sh up $h RATE" >&2; exit 2; }
  # shellcheck disable=SC2054  # the commas are inside --host's value
  flags+=(--host "$(seq -s, -f "10.77.0.%g:$slots" 1 "$h")" -n "$n" --map-by "$([[ $slots == 1 ]] && echo node || echo "ppr:$slots:node")")
fi
# shellcheck disable=SC2054  # the commas are inside --host's value
flags+=(--mca plm_rsh_agent "$here/rsh-agent.sh" --mca mpi_yield_when_idle "${SINEW_BED_YIELD:-1}"
  --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include mgmt0)
if [[ ${SINEW_BED_EAGER:-1} != 0 ]]; then
  flags+=(--mca btl_tcp_eager_limit 4194304 --mca btl_tcp_max_send_size 4194304)
fi

# Host 1 gets its hostname and its node memory the same way the agent gives the others theirs. The other
# hosts' node memory (under /dev/shm, which host 1's own now hides) stays reachable for the agent at
# /run/sinew-bed, a bind mount private to this launch.
shm=${SINEW_BED_SHM:-/dev/shm/sinew-bed}
mkdir -p /run/sinew-bed
exec ip netns exec sinew-h1 unshare --uts --mount --propagation private /bin/sh -c \
  'hostname sinew-h1 && { [ ! -d "$0/h1" ] || { mount --bind "$0" /run/sinew-bed && mount --bind "$0/h1" /dev/shm; }; } &&
   exec "$@"' "$shm" "$SINEW_MPIRUN" "${flags[@]}" "${mpi_args[@]}" "$@"
