#!/usr/bin/env bash
# Training-step benchmark, Sinew vs PyTorch DDP (gloo) in the same run: MLP 784-512-512-10, batch 64 per
# rank, SGD with momentum, Fashion-MNIST, one thread per rank. Alternates the two `rounds` times and
# prints each measurement, the medians and their ratio (>1: Sinew is faster).
# Usage: train_step_vs_torch.sh [RANKS] [ROUNDS] [OUT_DIR]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../mpi_scripts/env.sh"
ranks=${1:-2}
rounds=${2:-3}
out=${3:-$(mktemp -d)}
mkdir -p "$out"
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "error: PyTorch is missing; run SINEW_WITH_TORCH=1 bash mpi_scripts/setup.sh" >&2
  exit 2
fi
# One BLAS thread per rank, as Sinew's Eigen uses one thread per rank. OPENBLAS_CORETYPE is left as the
# machine sets it (some set it to avoid wrong kernels on their processor).
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
echo "# train-step: MLP 784-512-512-10, $ranks ranks x batch 64, SGD momentum 0.9, $rounds alternating rounds"
printf '%-8s %6s %6s %12s %12s %14s\n' impl ranks batch step_ms comm_ms samples/s
for r in $(seq 1 "$rounds"); do
  "$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}" -n "$ranks" "$SINEW_BUILD_DIR/apps/sinew-bench" train-step \
    --json "$out/sinew-$r.json" | tail -n 1
  timeout 600 /usr/bin/python3 "$here/torch_ddp_step.py" --ranks "$ranks" --json "$out/torch-$r.json" | tail -n 1
done
/usr/bin/python3 - "$out" "$rounds" "$ranks" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
s = statistics.median(json.load(open(f"{out}/sinew-{r}.json"))["step_ms"] for r in range(1, rounds + 1))
t = statistics.median(json.load(open(f"{out}/torch-{r}.json"))["step_ms"] for r in range(1, rounds + 1))
print(f"# median step: sinew {s:.3f} ms, torch DDP {t:.3f} ms; torch/sinew = {t / s:.2f}x "
      f"({'Sinew faster' if t > s else 'Sinew slower'})")
json.dump({"sinew_step_ms": s, "torch_step_ms": t, "ratio": t / s, "ranks": int(sys.argv[3])}, open(f"{out}/train_step_summary.json", "w"))
PY
