#!/usr/bin/env bash
# Checkpoint benchmarks, each against a peer in the same run:
#  1. write throughput of a 4-rank checkpoint vs dd with fdatasync on the same filesystem, restore time;
#  2. the cost of periodic checkpoints on the training step (MLP 784-512-512-10, 2 ranks, every 20 steps):
#     none vs synchronous vs asynchronous, alternating rounds.
# Usage: checkpoint_bench.sh DIR [ROUNDS] [OUT_DIR]   (DIR: a directory on the filesystem to measure)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../mpi_scripts/env.sh"
dir=${1:?usage: checkpoint_bench.sh DIR [ROUNDS] [OUT_DIR]}
rounds=${2:-3}
out=${3:-$(mktemp -d)}
mkdir -p "$dir" "$out"
bench=("$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}")
echo "== write throughput vs dd, restore time (4 ranks, 512 MiB)"
"${bench[@]}" -n 4 "$SINEW_BUILD_DIR/apps/sinew-bench" checkpoint --dir "$dir" --mb 512 --rounds "$rounds" \
  --json "$out/checkpoint-write.json"
echo "== checkpoint cost on the training step (2 ranks, every 20 steps)"
for r in $(seq 1 "$rounds"); do
  for mode in none sync async; do
    args=()
    [ "$mode" != none ] && args=(--checkpoint-dir "$dir/train" --checkpoint-every 20 --checkpoint-async
                                 "$([ $mode = async ] && echo true || echo false)")
    "${bench[@]}" -n 2 "$SINEW_BUILD_DIR/apps/sinew-bench" train-step "${args[@]}" --json "$out/step-$mode-$r.json" |
      tail -n 1
  done
done
rm -rf "$dir/train"
/usr/bin/python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def total(mode):  # step time plus the checkpoint time spent on the training thread
    vals = []
    for r in range(1, rounds + 1):
        j = json.load(open(f"{out}/step-{mode}-{r}.json"))
        vals.append(j["step_ms"] + j["checkpoint_ms_per_step"])
    return statistics.median(vals)
none, sync, asyn = total("none"), total("sync"), total("async")
w = json.load(open(f"{out}/checkpoint-write.json"))
print(f"# write: sinew {w['sinew_gbs']:.3f} GB/s vs dd {w['dd_gbs']:.3f} GB/s = {w['ratio']:.2f}x; restore {w['restore_s']:.3f} s")
print(f"# step (median, incl. checkpoint time on the training thread): none {none:.3f} ms, sync {sync:.3f} ms "
      f"(+{100 * (sync / none - 1):.1f} %), async {asyn:.3f} ms (+{100 * (asyn / none - 1):.1f} %)")
json.dump({"write": w, "step_none_ms": none, "step_sync_ms": sync, "step_async_ms": asyn},
          open(f"{out}/checkpoint_summary.json", "w"))
PY
