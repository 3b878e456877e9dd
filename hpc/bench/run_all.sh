#!/usr/bin/env bash
# Runs the benchmarks reported in docs/benchmarks.md and redraws its plots (docs/img/*.png).
# Needs a build (mpi_scripts/build.sh) and PyTorch for the side-by-side step (SINEW_WITH_TORCH=1 setup.sh).
# Usage: run_all.sh [OUT_DIR]   (raw JSON goes to OUT_DIR, default bench-results/)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../mpi_scripts/env.sh"
out=${1:-$sinew_root/bench-results}
mkdir -p "$out"
bench="$SINEW_BUILD_DIR/apps/sinew-bench"
for n in 2 4; do
  echo "== allreduce, $n ranks"
  "$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}" -n "$n" "$bench" allreduce --min-bytes 4096 --iters 30 \
    --json "$out/allreduce-$n.json"
done
echo "== training step vs PyTorch DDP, 2 ranks"
bash "$here/train_step_vs_torch.sh" 2 5 "$out"
echo "== checkpoints: write and restore vs dd (local disk, GlusterFS), cost on the training step"
bash "$here/checkpoint_bench.sh" "$out/checkpoint-dir" 3 "$out/checkpoint"
/usr/bin/python3 "$here/plot.py" "$sinew_root/docs/img" "$out/allreduce-2.json" "$out/allreduce-4.json" \
  --train-step "$out/train_step_summary.json" --checkpoint "$out/checkpoint/checkpoint_summary.json"
echo "== distillation: no teacher, in-process teacher, the service with 1 and 2 teachers, autoscaled, a table"
SINEW_BUILD=$SINEW_BUILD_DIR bash "$here/distill_bench.sh" "$out/distill-dir" 3 "$out/distill.json"
echo "== sharded optimiser state (--shard optimizer) vs the whole state: memory, step, recovery"
/usr/bin/python3 "$here/shard_bench.py" --json "$out/shard_bench.json"
if [ -x "$SINEW_TORCH_VENV/bin/python" ]; then
  echo "== sharded state on a PyTorch transformer: kill -> back at the failed step, Sinew vs torchrun + FSDP2 + DCP"
  "$SINEW_TORCH_VENV/bin/python" "$here/shard_recovery_bench.py" --rounds 3 --out "$out"
else
  echo "== no PyTorch venv ($SINEW_TORCH_VENV): shard_recovery_bench.py skipped"
fi
echo "plots written to docs/img/"
