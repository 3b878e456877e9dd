#!/usr/bin/env bash
# A Session driven from outside Sinew's loop (tests/mpi/session_driver.cpp: the program computes forward
# and backward of its own linear model), 4 ranks, a rank killed (kill -9) at each phase of a step. Each
# scenario asserts: exit 0, one failure recovered in place, the group grown back to 4 by a replacement
# spawned with the driver's own command line (which takes the state from the survivors' memory), the
# exactly-once audit, and final parameters equal to the failure-free run's.
#
# Usage: session_scenarios.sh SCENARIO WORKDIR DRIVER MPIEXEC [MPIEXEC_FLAGS...]
#   SCENARIO: reference, forward, backward, allreduce, optimizer, spare
set -u
scenario=$1
workdir=$2
driver=$3
shift 3
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
n=4
train_size=512  # session_driver.cpp's kTrain
epochs=3

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
trap "[ -n \"\${KEEP:-}\" ] || rm -rf \"\$d\"" EXIT

# run DEADLINE_S [options...]: the job, with a deadline so that a hang fails the scenario.
run() {
  local deadline=$1
  shift
  timeout -k 5 "$deadline" "${mpiexec[@]}" -n $n "$driver" --epochs $epochs --batch-size 8 --lr 0.05 \
    --lr-schedule constant --warmup-steps 0 --progress false --log-every 4 --timeout-ms 30000 \
    --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --driver-out "$d/params.json" "$@" >"$d/out.txt" 2>&1
}

fail() {
  echo "FAIL $scenario: $*"
  echo "---- last lines of the job's output ----"
  tail -n 40 "$d/out.txt"
  exit 1
}

# Final parameters against the reference run's: the lost step is redone at the same size, so they agree
# to float rounding (the reduction's order may differ with the ranks' new numbering).
same_params() {
  python3 - "$workdir/reference-params.json" "$d/params.json" <<'PY'
import json, sys
ref = json.load(open(sys.argv[1]))["params"]
got = json.load(open(sys.argv[2]))["params"]
assert len(ref) == len(got), f"{len(got)} parameters, the reference has {len(ref)}"
worst = max(abs(a - b) / (1 + abs(a)) for a, b in zip(ref, got))
print(f"final parameters: largest relative difference to the failure-free run {worst:.2e}")
sys.exit(0 if worst <= 1e-4 else "FAIL: the parameters differ from the failure-free run's")
PY
}

case "$scenario" in
  reference)
    run 120 || fail "exit $?"
    python3 "$here/check_run.py" "$d/metrics.jsonl" --failures 0 --final-world-size 4 || fail "metrics"
    python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $train_size --epochs $epochs || fail "audit"
    cp "$d/params.json" "$workdir/reference-params.json"
    ;;
  forward | backward | allreduce | optimizer)
    run 120 --inject-fault "2:$scenario:13" || fail "exit $?"
    python3 "$here/check_run.py" "$d/metrics.jsonl" --failures 1 --event shrink --event grow --event recovered \
      --final-world-size 4 || fail "metrics"
    python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $train_size --epochs $epochs || fail "audit"
    same_params || fail "parameters"
    ;;
  spare)
    # 5 processes, the last a hot spare: promoted in place of the killed rank, state from memory.
    n=5
    run 120 --spares 1 --inject-fault "1:backward:13" || fail "exit $?"
    python3 "$here/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered --final-world-size 4 \
      || fail "metrics"
    python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $train_size --epochs $epochs || fail "audit"
    same_params || fail "parameters"
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "ok   session.$scenario"
