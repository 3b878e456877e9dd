#!/usr/bin/env bash
# The README's first command: set-up (if needed), build, then a 4-rank data-parallel training run of the
# MLP 784-512-512-10 on Fashion-MNIST for 3 epochs. Metrics go to fashion-mnist-metrics.jsonl.
# Extra arguments go to sinew-train (e.g. --epochs 1, --model cnn).
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
bash "$here/setup.sh"
bash "$here/build.sh" >/dev/null
. "$here/env.sh"
ranks=${SINEW_RANKS:-4}
metrics=${SINEW_METRICS:-$PWD/fashion-mnist-metrics.jsonl}
echo "[sinew] mpirun -n $ranks sinew-train --model mlp:512,512 --dataset fashion-mnist --epochs 3 --metrics $metrics $*"
"$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}" -n "$ranks" "$SINEW_BUILD_DIR/apps/sinew-train" \
  --model mlp:512,512 --dataset fashion-mnist --epochs 3 --batch-size 64 --metrics "$metrics" "$@"
python3 - "$metrics" <<'PY'
import json, sys
done = [json.loads(l) for l in open(sys.argv[1]) if '"done"' in l][-1]
print(f"[sinew] final test accuracy {100 * done['test_accuracy']:.2f}% after {done['epochs']} epochs, "
      f"{done['steps']} steps on {done['world_size']} ranks, {done['samples_per_s']:.0f} samples/s")
PY
