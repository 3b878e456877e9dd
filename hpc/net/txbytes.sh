#!/usr/bin/env bash
# Bytes transmitted so far on eth0 of each test-bed host, one line per host: `sinew-hK BYTES`; with --json one
# object {"sinew-h1": BYTES, ...}. Take it before and after a run and subtract to get what each host really
# put on the wire (Ethernet frames: headers of every layer included, the kernel's own counter).
# Usage: txbytes.sh [--json] [N]      (N: hosts 1..N; default all hosts of the bed)
set -euo pipefail
json=0
[[ ${1:-} == --json ]] && { json=1; shift; }
if [[ -n ${1:-} ]]; then
  hosts=$(seq -f 'sinew-h%g' 1 "$1")
else
  hosts=$(ip netns list | awk '{print $1}' | grep -E '^sinew-h[0-9]+$' | sort -V)
fi
[[ -n $hosts ]] || { echo "error: no test bed (hpc/net/testbed.sh up N RATE)" >&2; exit 1; }
sep=
((json)) && printf '{'
for ns in $hosts; do
  # `ip netns exec` mounts the namespace's own /sys, so this is the host's eth0, not the root's.
  b=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)
  if ((json)); then printf '%s"%s": %s' "$sep" "$ns" "$b"; sep=', '; else echo "$ns $b"; fi
done
((json)) && echo '}'
exit 0
