#!/usr/bin/env bash
# A shaped multi-host network on one machine: N "hosts" as network namespaces sinew-h1..sinew-hN, each with
# an eth0 (10.77.0.K/24) wired by a veth pair to one bridge that lives in its own namespace, sinew-br.
# Every link is rate-limited in both directions with tc tbf (this kernel has no netem, so there is no
# latency or loss emulation: only bandwidth). Nothing is created in, or changed on, the root namespace:
# the veths are created inside sinew-br and their host ends moved straight into the host namespaces.
#
# Like a cluster node, each host also has a management interface, mgmt0 (10.78.0.K/24, unshaped, on a
# bridge of its own), which carries the launcher's control traffic (PRRTE's daemons) while MPI's data goes
# over eth0. Network faults cut the data network only: a NIC or switch port that goes dark while the node
# and its management network stay up. (PRRTE 3.0 ends the whole job when it loses a daemon, so a host cut
# off on both networks cannot be recovered in place; docs/fault-tolerance.md.)
#
# Each host has its own node memory: a directory SHM_ROOT/hK (/dev/shm/sinew-bed/hK) that the launcher
# (mpirun.sh, rsh-agent.sh) mounts over /dev/shm in a mount namespace of the host's processes, so that what a
# rank keeps in /dev/shm (Sinew's --state-mirror) is seen by that host's processes only, outlives them like a
# node's tmpfs outlives its processes, and is gone when the host is lost (`lose`).
#
# Usage: testbed.sh up N RATE     create (or re-create) N hosts; RATE is `unlimited` or a tc rate (1gbit)
#        testbed.sh rate RATE     change the rate of the existing bed in place
#        testbed.sh cut K         host K's data link goes down (its processes stay up, unreachable)
#        testbed.sh partition K.. the listed hosts' data links move to a bridge of their own: two halves
#                                 that each still reach their own members, and nothing of the other
#        testbed.sh heal          every data link up and on the one bridge again
#        testbed.sh lose K        host K is lost, as a node that loses power: both its links go dark, every
#                                 process on it (ranks, PRRTE's daemon) is killed at once, and its /dev/shm
#                                 is emptied. `up` brings it back
#        testbed.sh down          remove everything this script creates (safe when nothing exists)
#        testbed.sh status        namespaces, addresses, qdiscs
# Needs root. Launch ranks on it with hpc/net/mpirun.sh; tx byte counters with hpc/net/txbytes.sh.
set -euo pipefail

BR_NS=sinew-br
HOST_PREFIX=sinew-h
SUBNET=10.77.0
MGMT_SUBNET=10.78.0
SHM_ROOT=${SINEW_BED_SHM:-/dev/shm/sinew-bed}  # the hosts' node memory (rsh-agent.sh and mpirun.sh mount it)

usage() { sed -n '19,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

hosts() {  # the host namespaces that exist now, in numeric order
  ip netns list | awk '{print $1}' | grep -E "^${HOST_PREFIX}[0-9]+$" | sort -V || true
}

# tc rate -> bytes per second, for sizing the bucket. Accepts NUMBER[k|m|g|t]bit (as tc does, powers of 1000).
rate_bytes() {
  local r=${1,,} n unit mult
  [[ $r =~ ^([0-9]+)(k|m|g|t)?bit$ ]] || { echo "error: rate '$1' is not unlimited or N[k|m|g|t]bit" >&2; exit 2; }
  n=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; t) mult=1000000000000 ;; *) mult=1 ;; esac
  echo $((n * mult / 8))
}

# Applies RATE to one device in namespace NS (egress of that device). The bucket size (burst) is a
# trade-off: after an idle moment the whole bucket leaves at memory speed, which no real link does, and
# the collectives of a training step are exactly such bursts after compute. A 1 MB bucket at 1 Gbit made
# a 1 MiB allreduce look twice as fast as the link allows; with a bucket of 1 ms of traffic plus one 64 KiB
# GSO super-packet (tbf would otherwise split those) the allreduce figures stop moving with the bucket and
# iperf3 still gets 95 % of the rate (0.95-0.96 Gbit/s, 95.7 Mbit/s) on the 2 busy cores; smaller buckets
# fell to 84-93 %. `latency` bounds the queue: 20 ms fills TCP's window without a deep standing queue
# (2-100 ms changed no allreduce time).
shape() {
  local ns=$1 dev=$2 rate=$3 bps burst
  if [[ $rate == unlimited ]]; then
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    return
  fi
  bps=$(rate_bytes "$rate")
  burst=$((bps / 1000 + 65536 + 1514))  # 1 ms of traffic + one GSO packet + one frame
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 20ms
}

set_rate() {
  local rate=$1 ns k
  [[ $rate == unlimited ]] || rate_bytes "$rate" >/dev/null
  for ns in $(hosts); do
    k=${ns#"$HOST_PREFIX"}
    shape "$ns" eth0 "$rate"       # host -> bridge
    shape "$BR_NS" "p$k" "$rate"   # bridge -> host: together full-duplex RATE per host
  done
}

down() {
  local ns pids
  for ns in $(hosts) $(ip netns list | awk '{print $1}' | grep -Fx "$BR_NS" || true); do
    # A namespace lives on while a process runs in it (e.g. a rank left by a failed run), holding its
    # links: stop those processes (by pid) before removing the namespace.
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    if ((${#pids[@]})); then
      kill -TERM "${pids[@]}" 2>/dev/null || true
      sleep 1
      mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
      ((${#pids[@]} == 0)) || kill -KILL "${pids[@]}" 2>/dev/null || true
    fi
    ip netns del "$ns"  # deleting a namespace also deletes the veth ends inside it, hence their peers
  done
  rm -rf "$SHM_ROOT"
}

up() {
  local n=$1 rate=$2 k ns
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 250)) || { echo "error: N must be 1..250, got '$n'" >&2; exit 2; }
  [[ $rate == unlimited ]] || rate_bytes "$rate" >/dev/null
  down  # up is idempotent: start from nothing
  ip netns add "$BR_NS"
  ip -n "$BR_NS" link add name br0 type bridge   # STP is off by default: ports forward at once
  ip -n "$BR_NS" link set br0 up
  ip -n "$BR_NS" link add name mg0 type bridge   # the management network
  ip -n "$BR_NS" link set mg0 up
  ip -n "$BR_NS" link set lo up
  for k in $(seq 1 "$n"); do
    ns=$HOST_PREFIX$k
    ip netns add "$ns"
    # Created inside sinew-br, the host end is moved into the host namespace in the same call, so no
    # interface ever appears in the root namespace.
    ip -n "$BR_NS" link add name "p$k" type veth peer name eth0 netns "$ns"
    ip -n "$BR_NS" link set "p$k" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$SUBNET.$k/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$BR_NS" link add name "m$k" type veth peer name mgmt0 netns "$ns"
    ip -n "$BR_NS" link set "m$k" master mg0 up
    ip -n "$ns" addr add "$MGMT_SUBNET.$k/24" dev mgmt0
    ip -n "$ns" link set mgmt0 up
    mkdir -p "$SHM_ROOT/h$k"
    chmod 1777 "$SHM_ROOT/h$k"
  done
  set_rate "$rate"
  echo "testbed: $n hosts ${HOST_PREFIX}1..$HOST_PREFIX$n ($SUBNET.1..$SUBNET.$n), rate $rate"
}

host_k() {  # validates a host number of the bed
  [[ $1 =~ ^[0-9]+$ ]] && ip netns list | grep -qE "^$HOST_PREFIX$1( |$)" ||
    { echo "error: '$1' is not a host of the bed (1..N; see testbed.sh status)" >&2; exit 2; }
}

# The data link of host K goes down at the bridge's end: frames neither leave nor reach the host, as when
# a switch port or a NIC goes dark. The host's own interface stays up (as it would on a real node) and
# nothing tells its sockets: TCP retransmits into the void.
cut() {
  host_k "$1"
  ip -n "$BR_NS" link set "p$1" down
  echo "testbed: host $1 cut off the data network"
}

# The listed hosts' data ports move to bridge br1: each half still reaches its own members.
partition() {
  local k
  [[ $# -ge 1 ]] || usage
  for k in "$@"; do host_k "$k"; done
  ip -n "$BR_NS" link show br1 >/dev/null 2>&1 || {
    ip -n "$BR_NS" link add name br1 type bridge
    ip -n "$BR_NS" link set br1 up
  }
  for k in "$@"; do ip -n "$BR_NS" link set "p$k" master br1; done
  echo "testbed: data network partitioned: {$*} apart from the rest"
}

heal() {
  local ns k
  for ns in $(hosts); do
    k=${ns#"$HOST_PREFIX"}
    ip -n "$BR_NS" link set "p$k" master br0 up
    ip -n "$BR_NS" link set "m$k" up  # after a `lose`
  done
  if ip -n "$BR_NS" link show br1 >/dev/null 2>&1; then ip -n "$BR_NS" link del br1; fi
  echo "testbed: data network healed"
}

# Host K is lost: its links go dark first (no FIN or RST leaves it, as from a node that loses power), then
# every process in its namespace is killed with SIGKILL at once, and its node memory is emptied.
lose() {
  local pids
  host_k "$1"
  ip -n "$BR_NS" link set "p$1" down
  ip -n "$BR_NS" link set "m$1" down
  mapfile -t pids < <(ip netns pids "$HOST_PREFIX$1" 2>/dev/null || true)
  ((${#pids[@]} == 0)) || kill -KILL "${pids[@]}" 2>/dev/null || true
  rm -rf "${SHM_ROOT:?}/h$1"
  mkdir -p "$SHM_ROOT/h$1"
  chmod 1777 "$SHM_ROOT/h$1"
  echo "testbed: host $1 lost (${#pids[@]} processes killed, its /dev/shm emptied)"
}

status() {
  local ns
  if [[ -z $(hosts) ]]; then echo "testbed: down"; return; fi
  for ns in $(hosts); do
    printf '%-10s %-16s %s\n' "$ns" "$(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}')" \
      "$(ip netns exec "$ns" tc qdisc show dev eth0 | head -n 1)"
  done
  ip netns exec "$BR_NS" tc qdisc show | grep ' dev p' || true
}

[[ $(id -u) -eq 0 ]] || { echo "error: testbed.sh needs root (network namespaces, tc)" >&2; exit 1; }
case ${1:-} in
  up) [[ $# -eq 3 ]] || usage; up "$2" "$3" ;;
  rate) [[ $# -eq 2 ]] || usage; [[ -n $(hosts) ]] || { echo "error: no bed; run up first" >&2; exit 1; }
    set_rate "$2"; echo "testbed: rate $2" ;;
  cut) [[ $# -eq 2 ]] || usage; cut "$2" ;;
  partition) shift; partition "$@" ;;
  heal) [[ $# -eq 1 ]] || usage; heal ;;
  lose) [[ $# -eq 2 ]] || usage; lose "$2" ;;
  down) [[ $# -eq 1 ]] || usage; down ;;
  status) status ;;
  *) usage ;;
esac
