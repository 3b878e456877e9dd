#!/usr/bin/env bash
# Two ranks killed in the same step under bare mpirun (QAdam, checkpoints on), TRIALS times; when a trial is
# still running after 45 s, the stacks of every process (gdb) are kept next to its log.
#   bash hpc/chaos/double_kill.sh [TRIALS] [OUT] [extra sinew-train options, e.g. --stall-timeout-ms 60000]
set -u
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$root/mpi_scripts/env.sh"
trials=${1:-8}
out=${2:-/tmp/sinew-double-kill}
shift 2 2>/dev/null || shift $#
mkdir -p "$out"
for i in $(seq 1 "$trials"); do
  d="$out/$i"
  rm -rf "$d"
  mkdir -p "$d"
  "$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}" -n 4 "$SINEW_BUILD_DIR/apps/sinew-train" --model mlp:512,512 \
    --dataset fashion-mnist --epochs 1 --max-steps 100 --algorithm qadam --optimizer adam \
    --checkpoint-dir "$d/ckpt" --checkpoint-every 20 --inject-fault 1:forward:40 --inject-fault 2:forward:40 \
    --progress false --metrics "$d/metrics.jsonl" "$@" >"$d/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 45); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "trial $i: still running after 45 s; stacks in $d"
    for p in $(pgrep -f "$SINEW_BUILD_DIR/apps/sinew-train --model mlp:512,512"); do
      gdb -batch -p "$p" -ex "thread apply all bt" >"$d/stack-$p.txt" 2>&1
    done
  fi
  wait "$pid"
  rc=$?
  echo "trial $i: exit $rc, done events $(grep -c '"done"' "$d/metrics.jsonl" 2>/dev/null)"
done
