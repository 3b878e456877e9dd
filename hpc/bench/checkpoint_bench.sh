#!/usr/bin/env bash
# Checkpoint benchmarks, each against a peer in the same run:
#  1. write throughput of a 4-rank checkpoint vs dd with fdatasync on the same filesystem, restore time;
#  2. the cost of periodic checkpoints on the training step (MLP 784-512-512-10, 2 ranks, every 20 and every
#     100 steps): none vs synchronous vs asynchronous, alternating rounds.
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
# Two intervals: every 20 steps (a checkpoint every ~0.1 s, a stress test) and every 100 steps (still far
# more often than a real job, which checkpoints every few minutes). 1000 timed steps per run.
everies=(20 100)
for every in "${everies[@]}"; do
  echo "== checkpoint cost on the training step (2 ranks, every $every steps)"
  for r in $(seq 1 "$rounds"); do
    for mode in none sync async; do
      args=()
      [ "$mode" != none ] && args=(--checkpoint-dir "$dir/train" --checkpoint-every "$every" --checkpoint-async
                                   "$([ $mode = async ] && echo true || echo false)")
      "${bench[@]}" -n 2 "$SINEW_BUILD_DIR/apps/sinew-bench" train-step --steps 1000 "${args[@]}" \
        --json "$out/step-$every-$mode-$r.json" | tail -n 1
    done
  done
done
rm -rf "$dir/train"
/usr/bin/python3 - "$out" "$rounds" "${everies[@]}" <<'PY'
import json, statistics, sys
out, rounds, everies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
w = json.load(open(f"{out}/checkpoint-write.json"))
print(f"# write: sinew {w['sinew_gbs']:.3f} GB/s vs dd {w['dd_gbs']:.3f} GB/s = {w['ratio']:.2f}x; restore {w['restore_s']:.3f} s")
summary = {"write": w}
for every in everies:
    def total(mode):  # step time plus the checkpoint time spent on the training thread
        vals = []
        for r in range(1, rounds + 1):
            j = json.load(open(f"{out}/step-{every}-{mode}-{r}.json"))
            vals.append(j["step_ms"] + j["checkpoint_ms_per_step"])
        return statistics.median(vals)
    none, sync, asyn = total("none"), total("sync"), total("async")
    print(f"# every {every} steps, step (median, incl. checkpoint time on the training thread): none {none:.3f} ms, "
          f"sync {sync:.3f} ms (+{100 * (sync / none - 1):.1f} %), async {asyn:.3f} ms (+{100 * (asyn / none - 1):.1f} %)")
    summary[f"every_{every}"] = {"step_none_ms": none, "step_sync_ms": sync, "step_async_ms": asyn}
json.dump(summary, open(f"{out}/checkpoint_summary.json", "w"))
PY
