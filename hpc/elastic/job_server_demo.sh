#!/usr/bin/env bash
# The job-server demo (Paddle EDL's, done with MPI): a Fashion-MNIST run whose size a schedule changes
# over time -- 4 ranks, down to 2 at step 100 (ranks leave at a step boundary), back to 4 at step 250 (spawned, state from the
# others' memory), down to 3 at step 400 -- with the lr rescaled linearly on every resize, and one rank killed at
# step 450 (the group shrinks to 2 and spawns one back).
# Then plots world size, throughput and loss over time with the events marked.
# usage: hpc/elastic/job_server_demo.sh [OUT_DIR]   (default: docs/img for the PNG, a temp dir for the rest)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "$root/mpi_scripts/env.sh"
out=${1:-$root/docs/img}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
"$SINEW_MPIRUN" "${SINEW_MPIRUN_FLAGS[@]}" -n 4 "$SINEW_BUILD_DIR/apps/sinew-train" \
  --dataset fashion-mnist --model mlp:512,512 --epochs 2 --batch-size 64 --log-every 10 --progress false \
  --metrics "$work/metrics.jsonl" --audit-dir "$work/audit" --lr-scaling linear --lr 0.05 \
  --resize-schedule 100:2,250:4,400:3 --inject-fault 1:forward:450
python3 "$root/mpi_scripts/check-audit.py" "$work/audit" --dataset-size 60000 --epochs 2 | tail -n 1
cp "$work/metrics.jsonl" "$out/job_server_demo.jsonl"
/usr/bin/python3 "$root/hpc/elastic/plot_run.py" "$work/metrics.jsonl" "$out/job_server_demo.png"
