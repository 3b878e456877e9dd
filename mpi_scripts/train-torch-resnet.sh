#!/usr/bin/env bash
# torchvision's ResNet-18 on Fashion-MNIST in a PyTorch script's own loop (examples/torch/train_resnet.py:
# zero_grad, backward, step, a DataLoader, a scheduler; Sinew's four lines), 4 ranks, 3 epochs, under
# sinew-run: set-up (if needed; it installs Torch from PyPI), build, then about a third of the way in one rank
# is killed with kill -9. The others recover in place inside the script's loop, take the state from their
# memory, redo the step and spawn a replacement (python3 running the same script) that takes its state from
# theirs and joins the loop at the current epoch and step; the job finishes. Prints the recovery's timings,
# checks the exactly-once audit and prints the test accuracy. About 10 minutes on 2 cores.
# SINEW_KILL=0 trains without the kill. Extra arguments go to the script (its own: --epochs, --lr, ...).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$here/setup.sh"
bash "$here/build.sh" >/dev/null
. "$here/env.sh"
if [ ! -e "$SINEW_BUILD_DIR/python/sinew/__init__.py" ] || ! ls "$SINEW_BUILD_DIR"/python/sinew/_core*.so >/dev/null 2>&1; then
  echo "[sinew] the Python package was not built (no Torch >= 2.1: see $SINEW_BUILD_DIR/configure.log)" >&2
  exit 1
fi
ranks=${SINEW_RANKS:-4}
epochs=3
metrics=${SINEW_METRICS:-$PWD/torch-resnet-metrics.jsonl}
audit=$(mktemp -d)
trap 'rm -rf "$audit"' EXIT
rm -f "$metrics"
script=$(cd "$here/../examples/torch" && pwd)/train_resnet.py
export PYTHONPATH="$SINEW_BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}"
# Sinew's options go to sinew-run (the job gets them in SINEW_OPTIONS); the script's own after the program.
sinew_opts=(--metrics "$metrics" --audit-dir "$audit" --log-every 100)
echo "[sinew] sinew-run -n $ranks ${sinew_opts[*]} -- python3 examples/torch/train_resnet.py --epochs $epochs $*"
"$here/sinew-run" -n "$ranks" "${sinew_opts[@]}" -- "$SINEW_TORCH_VENV/bin/python" "$script" --epochs $epochs "$@" &
job=$!
if [ "${SINEW_KILL:-1}" = 1 ]; then
  bash "$here/kill-at-step.sh" "$metrics" 500 "$script" $job  # step 500 of ~1400
fi
rc=0
wait $job || rc=$?
python3 "$here/recovery-report.py" "$metrics"
python3 "$here/check-audit.py" "$audit" --dataset-size 60000 --epochs $epochs | tail -n 1
exit $rc
