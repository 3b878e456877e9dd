#!/usr/bin/env bash
# Checkpoint benchmarks, each against a peer in the same run:
#  1. write and restore throughput of a 4-rank checkpoint (512 MiB) against dd on the same filesystem:
#     write vs dd with fdatasync; restore (every rank reads the whole checkpoint into memory in use, as the
#     trainer does) vs dd reading the same shard files on every rank, with a warm and a cold page cache.
#     On local disk (DIR) and on a GlusterFS volume (hpc/pfs/glusterfs.sh, 4 bricks, distribute) in one
#     run; the GlusterFS part is skipped, saying so, where this machine cannot run FUSE or GlusterFS.
#  2. the cost of periodic checkpoints on the training step (MLP 784-512-512-10, 2 ranks, every 20 and every
#     100 steps): none vs synchronous vs asynchronous, alternating rounds, on local disk.
# Usage: checkpoint_bench.sh DIR [ROUNDS] [OUT_DIR]   (DIR: a directory on the local filesystem)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../mpi_scripts/env.sh"
dir=${1:?usage: checkpoint_bench.sh DIR [ROUNDS] [OUT_DIR]}
rounds=${2:-3}
out=${3:-$(mktemp -d)}
mkdir -p "$dir" "$out"
bench=("$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}")
pfs="$here/../pfs/glusterfs.sh"
echo "== write and restore vs dd: local disk ($dir), 4 ranks, 512 MiB"
"${bench[@]}" -n 4 "$SINEW_BUILD_DIR/apps/sinew-bench" checkpoint --dir "$dir" --mb 512 --rounds "$rounds" \
  --json "$out/checkpoint-local.json"
export SINEW_PFS_DIR=${SINEW_PFS_DIR:-/tmp/sinew-pfs-bench}
rc=0
"$pfs" up --bricks 4 >"$out/pfs-up.log" 2>&1 || rc=$?
if [ $rc -eq 0 ]; then
  trap '"$pfs" down >/dev/null 2>&1' EXIT
  eval "$("$pfs" env)"
  echo "== write and restore vs dd: GlusterFS ($SINEW_PFS_MOUNT, 4 bricks, distribute), 4 ranks, 512 MiB"
  "${bench[@]}" -n 4 "$SINEW_BUILD_DIR/apps/sinew-bench" checkpoint --dir "$SINEW_PFS_MOUNT/bench" --mb 512 \
    --rounds "$rounds" --json "$out/checkpoint-glusterfs.json"
  "$pfs" down >/dev/null 2>&1
  trap - EXIT
elif [ $rc -eq 77 ]; then
  echo "== GlusterFS: skipped, this machine cannot run it: $(tail -n 1 "$out/pfs-up.log")"
else
  cat "$out/pfs-up.log" >&2
  exit "$rc"
fi
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
import os
summary = {}
for fs_name in ("local", "glusterfs"):
    path = f"{out}/checkpoint-{fs_name}.json"
    if not os.path.exists(path):
        continue
    w = json.load(open(path))
    cold = ("n/a (cannot drop the page cache)" if w["restore_cold_ratio"] is None else
            f"{w['restore_cold_gbs']:.3f} vs dd {w['dd_read_cold_gbs']:.3f} GB/s = {w['restore_cold_ratio']:.2f}x")
    print(f"# {fs_name}: write {w['sinew_gbs']:.3f} vs dd {w['dd_gbs']:.3f} GB/s = {w['ratio']:.2f}x; "
          f"restore warm {w['restore_warm_gbs']:.3f} vs dd {w['dd_read_warm_gbs']:.3f} GB/s = "
          f"{w['restore_warm_ratio']:.2f}x; restore cold {cold}")
    summary[fs_name] = w

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
