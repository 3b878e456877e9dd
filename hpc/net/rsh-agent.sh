#!/usr/bin/env bash
# Open MPI / PRRTE remote-shell agent for the test bed (hpc/net/testbed.sh): `--mca plm_rsh_agent` calls it
# the way it would call ssh, `rsh-agent.sh [options] HOST COMMAND...`, and it runs COMMAND (shell code, as
# ssh would) inside the host's network namespace instead of on another machine. HOST is 10.77.0.K or
# sinew-hK (optionally user@...), both meaning namespace sinew-hK. Each host also gets its own UTS namespace
# with hostname sinew-hK, so ranks, logs and MPI_Get_processor_name tell the hosts apart, and a mount
# namespace whose /dev/shm is the host's own node memory (testbed.sh: /dev/shm/sinew-bed/hK).
set -euo pipefail

while [[ ${1:-} == -* ]]; do shift; done  # ssh-style options (none are passed today): ignored
[[ $# -ge 2 ]] || { echo "usage: rsh-agent.sh HOST COMMAND..." >&2; exit 2; }
host=${1##*@}
shift
case $host in
  10.77.0.*) k=${host#10.77.0.} ;;
  sinew-h*) k=${host#sinew-h} ;;
  *) k= ;;
esac
[[ $k =~ ^[0-9]+$ ]] && ip netns list | grep -qE "^sinew-h$k( |$)" ||
  { echo "rsh-agent.sh: '$host' is not a host of the test bed (10.77.0.K / sinew-hK; see testbed.sh status)" >&2; exit 255; }

# PRRTE prefixes the command with PATH/LD_LIBRARY_PATH exports when mpirun is called by its full path (or
# with --prefix); exporting the ULFM Open MPI here as well makes prted start however mpirun was called.
prefix=${SINEW_MPI_PREFIX:-/opt/sinew/openmpi-ulfm}
export PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# exec all the way down, so that PRRTE's signals reach the daemon and the agent ends with it (as ssh does).
# The host's node memory: under mpirun.sh (inside host 1, whose /dev/shm hides the others') at /run/sinew-bed.
shm=${SINEW_BED_SHM:-/dev/shm/sinew-bed}/h$k
[ ! -d "/run/sinew-bed/h$k" ] || shm=/run/sinew-bed/h$k
exec ip netns exec "sinew-h$k" unshare --uts --mount --propagation private /bin/sh -c \
  'hostname "$0" && { [ ! -d "$2" ] || mount --bind "$2" /dev/shm; } && exec /bin/sh -c "$1"' "sinew-h$k" "$*" "$shm"
