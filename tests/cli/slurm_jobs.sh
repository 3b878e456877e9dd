#!/usr/bin/env bash
# The batch templates of hpc/slurm/ submitted with sbatch to a real Slurm cluster (hpc/slurm/local-slurm.sh:
# munged, slurmctld, and one slurmd on each of two hosts of the shaped test bed), and checked with sacct,
# the job's output, its metrics and the exactly-once audit.
#
# Usage: slurm_jobs.sh SCENARIO WORKDIR SINEW_TRAIN (a program, or a command line of words)
#   complete     sinew-inplace.sbatch: a 4-rank job on 2 hosts finishes; its MPI traffic crossed the link
#   inplace-kill sinew-inplace.sbatch with a hot spare: a rank killed at step 40 is replaced in place
#   restart-kill sinew-restart.sbatch: a killed task ends the srun step; sinew-supervise launches a new
#                step that resumes from the checkpoint
#   torch-restart-kill  the same with a PyTorch script through the sinew package (SINEW_TRAIN is then
#                "PYTHON tests/torch/train_job.py --model mlp --"; PYTHONPATH names the package)
#   preempt      sinew-preemptible.sbatch: `scancel --batch --signal=USR1` at step 40: checkpoint, exit 75,
#                requeue; the requeued run (SLURM_RESTART_COUNT=1) resumes and finishes, appends to the
#                metrics, does not fire the injected fault again, and the audit holds across the requeue
# Needs root, Slurm (slurm-wlm, munge) and the data set; skipped (exit 77) otherwise.
set -u
scenario=$1
workdir=$2
train=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
slurm=$root/hpc/slurm
limit=8192
epochs=3
job_deadline_s=150

. "$here/lib.sh"
need_fashion_mnist "$scenario"
for p in ip slurmctld slurmd munged sbatch sacct; do
  command -v "$p" >/dev/null || { echo "SKIP $scenario: '$p' not found (slurm-wlm, munge, iproute2)"; exit 77; }
done
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP $scenario: the local Slurm cluster needs root (network namespaces, daemons)"
  exit 77
fi
case $scenario in complete | inplace-kill | restart-kill | torch-restart-kill | preempt) ;; *) echo "unknown scenario '$scenario'" >&2; exit 2 ;; esac

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
export SINEW_SLURM_DIR=$d/cluster
cleanup() { "$slurm/local-slurm.sh" down >/dev/null 2>&1; }
trap cleanup EXIT
t0=$(date +%s.%N)
if ! "$slurm/local-slurm.sh" up 2 >"$d/up.txt" 2>&1; then
  cat "$d/up.txt"
  echo "FAIL $scenario: the local Slurm cluster did not come up (logs: $SINEW_SLURM_DIR/log)"
  exit 1
fi
echo "cluster up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
eval "$("$slurm/local-slurm.sh" env)"
. "$root/mpi_scripts/env.sh"
export SINEW_MPIRUN SINEW_TRAIN=$train SINEW_SUPERVISE=$root/mpi_scripts/sinew-supervise
export SINEW_CHECKPOINT_DIR=$d/ckpt-%j SINEW_METRICS=$d/metrics-%j.jsonl
common=(--dataset fashion-mnist --limit-train "$limit" --limit-test 2000 --epochs "$epochs" --model mlp:64
  --batch-size 64 --lr 0.05 --progress false --audit-dir "$d/audit")

rc=0
fail() { echo "FAIL $scenario: $*"; rc=1; }
submit() { # TEMPLATE ARGS...: prints the job id
  sbatch --parsable --chdir="$d" "$slurm/$1" "${@:2}"
}
wait_job() { # JOB: until it left the queue, or the deadline
  local job=$1 t=$SECONDS
  while squeue -h -j "$job" 2>/dev/null | grep -q .; do
    if ((SECONDS - t > job_deadline_s)); then
      fail "job $job still in the queue after ${job_deadline_s} s"
      scancel "$job"
      return 1
    fi
    sleep 0.5
  done
}
state_of() { sacct -c -n -j "$1" -o State,ExitCode,NodeList -P | tail -n 1; }
metrics_of() { echo "$d/metrics-$1.jsonl"; }
summarise() { # JOB: timings and the end of the output
  local job=$1 out=$d/sinew-$1.out
  awk -v t0="$t_submit" '/Open MPI v/ && !s { s = 1; print "first rank up " substr($1, 2, 12) " (submitted " t0 ")" }' "$out"
  grep -a -E '\] \[info\] done:|recovered in place|resumed from|requeue|launch [0-9]+:' "$out" | sed 's/^/  | /'
}
check_common() { # JOB: COMPLETED 0:0 on both hosts, a done event, the audit
  local job=$1 st
  st=$(state_of "$job")
  echo "sacct: $st"
  [[ $st == "COMPLETED|0:0|sinew-h[1-2]" ]] || fail "sacct says '$st', not COMPLETED|0:0|sinew-h[1-2]"
  grep -q '"event":"done"' "$(metrics_of "$job")" 2>/dev/null || fail "no done event in $(metrics_of "$job")"
  python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $limit --epochs $epochs ||
    fail "the exactly-once audit failed"
}
count_events() { grep -c "\"event\":\"$2\"" "$(metrics_of "$1")" 2>/dev/null; }

t_submit=$(date +%T.%N | cut -c1-12)
case $scenario in
  complete)
    before=$("$root/hpc/net/txbytes.sh" --json 2)
    job=$(submit sinew-inplace.sbatch "${common[@]}") || { echo "FAIL: sbatch refused the job"; exit 1; }
    wait_job "$job"
    after=$("$root/hpc/net/txbytes.sh" --json 2)
    summarise "$job"
    check_common "$job"
    # Ranks on both hosts: each host sent the model's allreduce traffic over its eth0 (megabytes).
    python3 - "$before" "$after" <<'EOF' || fail "the job's MPI traffic did not cross both hosts' links"
import json, sys
b, a = (json.loads(x) for x in sys.argv[1:3])
sent = {h: a[h] - b[h] for h in a}
print("bytes sent on eth0:", sent)
sys.exit(0 if min(sent.values()) > 4e6 else 1)
EOF
    ;;
  inplace-kill)
    job=$(SINEW_SPARES=1 submit sinew-inplace.sbatch "${common[@]}" --step-sleep-ms 10 \
      --inject-fault 2:allreduce:40) || { echo "FAIL: sbatch refused the job"; exit 1; }
    wait_job "$job"
    summarise "$job"
    check_common "$job"
    m=$(metrics_of "$job")
    grep -q '"event":"failure"' "$m" || fail "no failure event: the rank was not killed"
    grep -q '"promoted":1' "$m" || fail "the failed rank was not replaced by the hot spare"
    [ "$(count_events "$job" start)" -eq 1 ] || fail "more than one start: the job was not recovered in place"
    ;;
  restart-kill | torch-restart-kill)
    job=$(submit sinew-restart.sbatch "${common[@]}" --checkpoint-every 20 --timeout-ms 30000 \
      --inject-fault 2:allreduce:50) || { echo "FAIL: sbatch refused the job"; exit 1; }
    wait_job "$job"
    summarise "$job"
    check_common "$job"
    grep -q 'launch 1: 4 ranks' "$d/sinew-$job.out" || fail "sinew-supervise did not launch a second srun step"
    grep -q '"event":"resume"' "$(metrics_of "$job")" || fail "the second step did not resume from a checkpoint"
    ;;
  preempt)
    # The fault is at step 70, after the preemption at step 40: the requeued run passes step 70 and must
    # not fire it (a requeue is a restart generation).
    job=$(submit sinew-preemptible.sbatch "${common[@]}" --step-sleep-ms 30 --inject-fault 1:allreduce:70) ||
      { echo "FAIL: sbatch refused the job"; exit 1; }
    m=$(metrics_of "$job")
    t=$SECONDS
    until grep -q '"step":40' "$m" 2>/dev/null; do
      ((SECONDS - t < 90)) || { fail "no step 40 in $m within 90 s"; break; }
      sleep 0.1
    done
    t_signal=$(date +%s.%N)
    scancel --batch --signal=USR1 "$job"
    wait_job "$job"
    summarise "$job"
    check_common "$job"
    grep -q 'run 1 on' "$d/sinew-$job.out" || fail "the job was not requeued (no second run in its output)"
    [ "$(count_events "$job" start)" -eq 2 ] || fail "the metrics of the first run were not kept (appended)"
    grep -q '"event":"resume"' "$m" || fail "the requeued run did not resume from the checkpoint"
    grep -q '"event":"failure"' "$m" && fail "the injected fault fired again after the requeue"
    grep -q 'injected fault' "$d/sinew-$job.out" && fail "the injected fault fired again after the requeue"
    python3 - "$m" "$t_signal" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
done = [e for e in ev if e.get("event") == "done"]
if done:
    print(f"signal -> requeued run done: {done[-1]['unix_time'] - float(sys.argv[2]):.1f} s")
EOF
    ;;
esac
if [ $rc -ne 0 ]; then
  echo "--- job output ($d):"
  tail -n 40 "$d"/sinew-*.out
  tail -n 20 "$SINEW_SLURM_DIR"/log/slurmctld.log
fi
[ $rc -eq 0 ] && echo "PASS $scenario"
exit $rc
