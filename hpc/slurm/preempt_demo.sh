#!/usr/bin/env bash
# The Slurm demo of docs/hpc.md, on the local cluster (local-slurm.sh: two hosts of the test bed): a
# Fashion-MNIST job from sinew-preemptible.sbatch with one hot spare; a rank is killed at step 60 (the
# spare takes its place, in place); at step 150 the job is preempted (`scancel --batch --signal=USR1`,
# what Slurm sends before a preemption or the time limit): it checkpoints, exits 75 and requeues itself;
# the requeued run resumes from the checkpoint and finishes. Then the exactly-once audit, sacct, and a
# plot of the metrics (both runs, one file) with the events marked.
# usage: hpc/slurm/preempt_demo.sh [OUT_DIR]   (default docs/img; needs root, slurm-wlm, munge)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
out=${1:-$root/docs/img}
work=$(mktemp -d)
export SINEW_SLURM_DIR=$work/cluster
trap '"$root/hpc/slurm/local-slurm.sh" down >/dev/null 2>&1; rm -rf "$work"' EXIT
mkdir -p "$out"
"$root/hpc/slurm/local-slurm.sh" up 2
eval "$("$root/hpc/slurm/local-slurm.sh" env)"
. "$root/mpi_scripts/env.sh"
export SINEW_MPIRUN SINEW_TRAIN=$SINEW_BUILD_DIR/apps/sinew-train SINEW_SPARES=1

# --step-sleep-ms slows the steps down so that the kill and the preemption land mid-run.
job=$(sbatch --parsable --chdir="$work" "$root/hpc/slurm/sinew-preemptible.sbatch" \
  --dataset fashion-mnist --limit-train 30000 --epochs 3 --model mlp:128 --batch-size 64 --lr 0.05 \
  --log-every 5 --progress false --step-sleep-ms 20 --checkpoint-every 50 --audit-dir "$work/audit" \
  --inject-fault 2:allreduce:60)
echo "submitted job $job"
metrics=$work/metrics-$job.jsonl
until grep -q '"step":150' "$metrics" 2>/dev/null; do sleep 0.2; done
echo "preempting job $job at step 150"
scancel --batch --signal=USR1 "$job"
sleep 2
while squeue -h -j "$job" | grep -q .; do sleep 1; done
sacct -c -j "$job" -o JobID,JobName,NNodes,NodeList,State,ExitCode,End
grep -a -E 'sinew-preemptible|recovered in place|signal 10|resumed from|\] \[info\] done:' "$work/sinew-$job.out"
python3 "$root/mpi_scripts/check-audit.py" "$work/audit" --dataset-size 30000 --epochs 3 | tail -n 1
cp "$metrics" "$out/slurm_preempt.jsonl"
/usr/bin/python3 "$root/hpc/elastic/plot_run.py" "$metrics" "$out/slurm_preempt.png" \
  --title "Slurm: a rank killed (hot spare), then preempted and requeued"
