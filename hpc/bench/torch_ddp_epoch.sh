#!/usr/bin/env bash
# Runs the PyTorch DDP epoch peer (torch_ddp_epoch.py) on the shaped test bed (hpc/net/testbed.sh), one rank
# per host, and prints rank 0's JSON line extended with what the hosts' eth0 counters saw over the whole run
# (rendezvous, initial broadcast and evaluation included): run_tx_bytes (sum over hosts), run_s.
#
# Usage: torch_ddp_epoch.sh N EPOCHS [torch_ddp_epoch.py options...]
#   Uses the bed as it is (hpc/net/testbed.sh up N RATE first). With BED_RATE=RATE set, it brings up an
#   N-host bed at that rate itself and removes it on exit, whatever happens (trap ... EXIT).
#   OUT=FILE also appends the JSON line to FILE.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
net=$here/../net
n=${1:?usage: torch_ddp_epoch.sh N EPOCHS [options]}
epochs=${2:?usage: torch_ddp_epoch.sh N EPOCHS [options]}
shift 2
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "error: PyTorch is missing: apt-get install -y python3-torch libopenblas0" >&2; exit 2; }

logs=$(mktemp -d)
pids=()
cleanup() {
  # Ranks still running (a rank failed, or we were interrupted) are stopped by pid: gloo would wait for
  # the missing peer until its timeout.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ -n ${BED_RATE:-} ]]; then "$net/testbed.sh" down; fi
  rm -rf "$logs"
}
trap cleanup EXIT
if [[ -n ${BED_RATE:-} ]]; then "$net/testbed.sh" up "$n" "$BED_RATE" >&2; fi
ip netns list | grep -qE "^sinew-h$n( |$)" ||
  { echo "error: the bed has fewer than $n hosts; run hpc/net/testbed.sh up $n RATE" >&2; exit 2; }

# One BLAS thread per rank, as Sinew's Eigen uses one thread per rank. Debian's torch uses the system
# BLAS; OpenBLAS mis-detects some AVX-512 processors and falls back to slow kernels, so name the core
# (FACTS: ~2 -> ~140 GFLOP/s), but only where AVX-512 really exists.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0
if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}; fi
# A fresh port per run: reusing one in back-to-back runs hung a gloo rendezvous once (torch_ddp_step.py).
port=$((20000 + RANDOM % 20000))

tx_before=$("$net/txbytes.sh" "$n" | awk '{s += $2} END {printf "%.0f\n", s}')
t0=$(date +%s.%N)
for k in $(seq 1 "$n"); do
  ip netns exec "sinew-h$k" timeout 3600 /usr/bin/python3 "$here/torch_ddp_epoch.py" --rank $((k - 1)) \
    --world "$n" --master "10.77.0.1:$port" --epochs "$epochs" "$@" >"$logs/r$k.out" 2>"$logs/r$k.err" &
  pids+=($!)
done
rc=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { rc=$?; echo "error: rank $i exited with $rc:" >&2; tail -n 20 "$logs/r$((i + 1)).err" >&2; }
done
pids=()
((rc == 0)) || exit "$rc"
t1=$(date +%s.%N)
tx_after=$("$net/txbytes.sh" "$n" | awk '{s += $2} END {printf "%.0f\n", s}')

/usr/bin/python3 - "$logs/r1.out" "$((tx_after - tx_before))" "$t0" "$t1" "${OUT:-}" <<'PY'
import json, sys
res = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
res["run_tx_bytes"] = int(sys.argv[2])
res["run_s"] = round(float(sys.argv[4]) - float(sys.argv[3]), 3)
line = json.dumps(res)
print(line)
if sys.argv[5]:
    open(sys.argv[5], "a").write(line + "\n")
PY
