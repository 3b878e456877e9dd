#!/usr/bin/env bash
# Distillation end to end, with real processes: a private etcd (hpc/etcd/etcd.sh), teachers
# (sinew-teacher serve) and students (sinew-train, under mpirun for the group cases).
#
# Usage: distill.sh CASE WORKDIR SINEW_TRAIN SINEW_TEACHER MPIEXEC [MPIEXEC_FLAGS...]
#   table     a logit table and a teacher inside the student's process; a table of other data is refused
#   service   2 students x 3 teachers: one teacher SIGKILLed, one SIGSTOPped (hung) mid-run, a new one
#             joins; training finishes and no step trains on missing logits (--distill-on-missing wait)
#   labels    no teacher answers: every step says it trained on the labels alone, the run finishes
#   resize    a student rank killed in its forward pass during distillation: the group recovers in place
#             (the teachers are not involved) and distillation goes on
#   bad       an unreachable registry (exit 6) and a missing token (exit 2)
# Every run has a deadline. Exit 77 (skipped) without etcd or Fashion-MNIST.
set -u
case_=$1
workdir=$2
train=$3
teacher=$4
shift 4
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/lib.sh"
need_fashion_mnist "distill.$case_"

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  [ -f "$d/etcd/pid" ] && bash "$root/hpc/etcd/etcd.sh" down --dir "$d/etcd" >/dev/null 2>&1
  [ -n "${KEEP:-}" ] || rm -rf "$d"
}
trap cleanup EXIT

limit=6000
data=(--dataset fashion-mnist --limit-train "$limit" --limit-test 2000)
echo "sinew-distill-test-token" >"$d/token"

# The teacher: a small MLP trained for one epoch on the same samples (a checkpoint like any other).
make_teacher() {
  timeout -k 5 120 "$train" "${data[@]}" --model mlp:128 --epochs 1 --progress false \
    --checkpoint-dir "$d/teacher" >"$d/teacher.txt" 2>&1 || {
    echo "FAIL: could not train the teacher:"
    tail -n 20 "$d/teacher.txt"
    exit 1
  }
}

# start_etcd: a private etcd in $d/etcd; sets reg to its endpoint (exit 77 without etcd).
start_etcd() {
  local rc=0
  reg=$(bash "$root/hpc/etcd/etcd.sh" up --dir "$d/etcd" 2>"$d/etcd.txt") || rc=$?
  if [ "$rc" -eq 77 ]; then
    skip "distill.$case_" "etcd is not installed (etcd-server; mpi_scripts/setup.sh installs it)"
    finish
  fi
  [ "$rc" -eq 0 ] || { echo "FAIL: etcd did not start:"; cat "$d/etcd.txt"; exit 1; }
}

# start_teacher NAME: a teacher registered under job "t"; its pid in tpid[NAME], waits until it serves.
declare -A tpid
start_teacher() {
  local name=$1
  "$teacher" serve --checkpoint "$d/teacher" --token-file "$d/token" --registry "$reg" --job t \
    --ready-file "$d/$name.ready" >"$d/$name.txt" 2>&1 &
  tpid[$name]=$!
  pids+=($!)
  local _
  for _ in $(seq 100); do
    [ -s "$d/$name.ready" ] && return 0
    kill -0 "${tpid[$name]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "FAIL: teacher $name did not start:"
  tail -n 20 "$d/$name.txt"
  exit 1
}

# metric EXPR: a Python expression over `done` (the done event) and `steps` (the step events).
metric() {
  python3 - "$d/metrics.jsonl" "$1" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
done = [e for e in ev if e.get("event") == "done"][-1]
steps = [e for e in ev if "event" not in e]
print(eval(sys.argv[2]))
EOF
}

# check NAME PYTHON-CONDITION: a case on the metrics of the last run.
check() {
  local out
  if out=$(metric "$2" 2>&1) && [ "$out" = True ]; then
    passed=$((passed + 1))
    echo "ok   $1"
  else
    failed=$((failed + 1))
    echo "FAIL $1: $2 is $out"
    tail -n 30 "$d/out.txt" | sed 's/^/     | /'
  fi
}

student=("${data[@]}" --model logreg --batch-size 32 --progress false --log-every 10
         --metrics "$d/metrics.jsonl" --timeout-ms 30000)

case $case_ in
  table)
    make_teacher
    expect "precompute" 0 "wrote logits of 6000 samples" -- \
      "$teacher" precompute --checkpoint "$d/teacher" --out "$d/table.h5"
    rm -f "$d/metrics.jsonl"
    expect "student from the table" 0 "distilling from logit table" -- \
      "$train" "${student[@]}" --epochs 1 --distill-table "$d/table.h5"
    check "table: no sample without logits" "done['distill_missing'] == 0 and 'table' in done['teacher']"
    rm -f "$d/metrics.jsonl"
    expect "student with the teacher in its process" 0 "distilling from teacher mlp:128" -- \
      "$train" "${student[@]}" --epochs 1 --distill-teacher-checkpoint "$d/teacher"
    check "in-process: no sample without logits" "done['distill_missing'] == 0"
    expect "a table of other data is refused" 3 "computed for other data" -- \
      "$train" --dataset fashion-mnist --limit-train 5000 --limit-test 1000 --model logreg --progress false \
      --distill-table "$d/table.h5"
    expect "a missing table is refused" 3 "does not exist" -- \
      "$train" "${student[@]}" --distill-table "$d/none.h5"
    ;;

  service)
    make_teacher
    start_etcd
    start_teacher a
    start_teacher b
    start_teacher c
    rm -f "$d/metrics.jsonl"
    # ~10 s of training at 2 ranks; the teachers are hit while it runs.
    timeout -k 5 150 "${mpiexec[@]}" -n 2 "$train" "${student[@]}" --epochs 2 --step-sleep-ms 60 \
      --distill-registry "$reg" --distill-job t --distill-token-file "$d/token" --distill-on-missing wait \
      --distill-timeout-ms 1000 >"$d/out.txt" 2>&1 &
    job=$!
    pids+=("$job")
    sleep 3
    kill -KILL "${tpid[a]}"  # dies mid-request: its lease expires
    sleep 2
    kill -STOP "${tpid[b]}"  # hangs: its lease expires too, and requests to it time out
    sleep 2
    start_teacher e  # a new teacher, picked up while the job runs
    rc=0
    wait "$job" || rc=$?
    kill -CONT "${tpid[b]}"
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1))
      echo "ok   service: training finished with teachers killed and hung"
    else
      failed=$((failed + 1))
      echo "FAIL service: exit $rc"
      tail -n 40 "$d/out.txt" | sed 's/^/     | /'
    fi
    # failures == 0: teacher errors never look like rank failures to the group.
    check "service: no step on missing logits, no group recovery" \
      "done['distill_missing'] == 0 and done['failures'] == 0"
    # Rank 0 sent requests to the dead or the hung teacher, and another teacher answered them.
    check "service: requests failed over" "done['distill_failovers'] >= 1"
    if grep -q "left" "$d/out.txt" && grep -q "joined" "$d/out.txt"; then
      passed=$((passed + 1))
      echo "ok   service: teachers seen leaving and joining"
    else
      failed=$((failed + 1))
      echo "FAIL service: no 'left'/'joined' teacher lines in the log"
      grep -i teacher "$d/out.txt" | tail -n 20 | sed 's/^/     | /'
    fi
    ;;

  labels)
    start_etcd
    rm -f "$d/metrics.jsonl"
    expect "no teacher: labels policy" 0 "trained on their labels alone" -- \
      timeout -k 5 120 "$train" "${student[@]}" --max-steps 30 --distill-registry "$reg" --distill-job none \
      --distill-token-file "$d/token" --distill-on-missing labels --distill-timeout-ms 100
    check "labels: every sample trained on its label, and counted" "done['distill_missing'] == done['samples']"
    ;;

  resize)
    make_teacher
    start_etcd
    start_teacher a
    rm -f "$d/metrics.jsonl"
    expect "a student rank killed during distillation" 0 "recovered" -- \
      timeout -k 5 150 "${mpiexec[@]}" -n 2 "$train" "${student[@]}" --epochs 1 \
      --distill-registry "$reg" --distill-job t --distill-token-file "$d/token" --distill-on-missing wait \
      --inject-fault 1:forward:40 --spawn-timeout-ms 20000
    check "resize: one failure recovered, no sample without logits" \
      "done['failures'] == 1 and done['distill_missing'] == 0"
    ;;

  bad)
    expect "unreachable registry" 6 "does not answer" -- \
      env SINEW_JOB_TOKEN=x "$train" "${student[@]}" --distill-registry http://127.0.0.1:1 --distill-job t
    expect "no token" 2 "needs the job's token" -- \
      env -u SINEW_JOB_TOKEN "$train" "${student[@]}" --distill-registry http://127.0.0.1:1 --distill-job t
    ;;

  *)
    echo "unknown case '$case_'"
    exit 2
    ;;
esac
finish
