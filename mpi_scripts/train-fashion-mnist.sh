#!/usr/bin/env bash
# The README's first command: set-up (if needed), build, then a 4-rank elastic training run of the MLP
# 784-512-512-10 on Fashion-MNIST for 3 epochs. A third of the way in, one rank is killed with kill -9:
# the others recover in place (ULFM: revoke, shrink, agree), spawn a replacement that takes its state
# from their memory, and the job finishes (under sinew-run: were the recovery to fail, the job would be
# relaunched from the newest state). Metrics go to fashion-mnist-metrics.jsonl; the exactly-once audit of
# every training sample is checked at the end.
# SINEW_KILL=0 trains without the kill. Extra arguments go to sinew-train (e.g. --epochs 1, --model cnn).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bash "$here/setup.sh"
bash "$here/build.sh" >/dev/null
. "$here/env.sh"
ranks=${SINEW_RANKS:-4}
metrics=${SINEW_METRICS:-$PWD/fashion-mnist-metrics.jsonl}
audit=$(mktemp -d)
trap 'rm -rf "$audit"' EXIT
args=(--model mlp:512,512 --dataset fashion-mnist --epochs 3 --batch-size 64 --metrics "$metrics" --audit-dir "$audit" "$@")
# Under sinew-run, the way Sinew jobs run: in place when ULFM can, relaunched from the newest state when it
# cannot (a node lost, a repair call stuck inside MPI).
echo "[sinew] sinew-run -n $ranks -- sinew-train ${args[*]}"
"$here/sinew-run" -n "$ranks" -- "$SINEW_BUILD_DIR/apps/sinew-train" "${args[@]}" &
job=$!
if [ "${SINEW_KILL:-1}" = 1 ]; then
  bash "$here/kill-at-step.sh" "$metrics" 250 "--audit-dir $audit" $job  # step 250 of ~700
fi
rc=0
wait $job || rc=$?
python3 "$here/recovery-report.py" "$metrics"
python3 "$here/check-audit.py" "$audit" --dataset-size 60000 --epochs 3 | tail -n 1
exit $rc
