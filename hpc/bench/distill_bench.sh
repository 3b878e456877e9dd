#!/usr/bin/env bash
# Distillation benchmark (docs/distillation.md): one student trained six ways, on cores pinned with taskset
# so that teachers and students never share a core (as they would not share a GPU):
#   none      no teacher (the baseline the distilled student must beat)
#   inproc    the teacher computed inside the student's process (--distill-teacher-checkpoint)
#   service1  the teacher service with 1 teacher
#   service2  the teacher service with 2 teachers
#   autoscale the teacher service run by `sinew-teacher autoscale` (from 1 teacher, up to the cores left)
#   table     a table of teacher logits computed beforehand (sinew-teacher precompute): the fastest source
#             when there is no data augmentation
# Each way runs SEEDS seeds (default 3); the script prints student throughput (samples/s) and final test
# accuracy per way, mean and spread, the distilled-minus-plain accuracy per seed, and the autoscaler's
# decisions, and writes everything as JSON to OUT (default hpc/bench/results/distill.json).
#
# Usage: hpc/bench/distill_bench.sh WORKDIR [SEEDS] [OUT]
#   env SINEW_BUILD      the build folder (default: build)
#       STUDENT_CORES    taskset list of the student (default: 0)
#       TEACHER_CORES    comma-separated cores for teachers, one per teacher (default: the others; on a
#                        2-core machine both teachers of service2 share core 1, said in the output)
#       TEACHER_EPOCHS   epochs of the CNN teacher (default 4); STUDENT_EPOCHS (default 2)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:?usage: distill_bench.sh WORKDIR [SEEDS] [OUT]}
seeds=${2:-3}
out=${3:-$root/hpc/bench/results/distill.json}
build=${SINEW_BUILD:-$root/build}
train=$build/apps/sinew-train
teacher=$build/apps/sinew-teacher
[ -x "$train" ] && [ -x "$teacher" ] || { echo "build Sinew first: $train, $teacher" >&2; exit 1; }
ncpu=$(nproc)
student_cores=${STUDENT_CORES:-0}
if [ -n "${TEACHER_CORES:-}" ]; then
  teacher_cores=$TEACHER_CORES
elif [ "$ncpu" -ge 3 ]; then
  teacher_cores=$(seq -s, 1 $((ncpu - 1)))
else
  teacher_cores=1
fi
IFS=, read -r -a tcores <<<"$teacher_cores"
tcore() { echo "${tcores[$(($1 % ${#tcores[@]}))]}"; }
teacher_epochs=${TEACHER_EPOCHS:-4}
student_epochs=${STUDENT_EPOCHS:-2}
student_model=${STUDENT_MODEL:-mlp}

mkdir -p "$work"
work=$(cd "$work" && pwd)
res=$work/results
rm -rf "$res" && mkdir -p "$res"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bash "$root/hpc/etcd/etcd.sh" down --dir "$work/etcd" >/dev/null 2>&1 || true
}
trap cleanup EXIT
say() { echo "[distill-bench] $*" >&2; }

# --- the teacher: a CNN, trained once (kept in WORKDIR for later runs) --------------------------------
if ! grep -q '"event":"done"' "$work/teacher.jsonl" 2>/dev/null || ! "$build/apps/sinew-ckpt" list "$work/teacher" >/dev/null 2>&1; then
  say "training the teacher (cnn, $teacher_epochs epochs) on core $(tcore 0)"
  rm -rf "$work/teacher" "$work/teacher.jsonl"
  taskset -c "$(tcore 0)" "$train" --model cnn --epochs "$teacher_epochs" --progress false \
    --checkpoint-dir "$work/teacher" --metrics "$work/teacher.jsonl" >"$work/teacher.txt" 2>&1
fi
teacher_acc=$(python3 -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"done\"" in l][-1]["test_accuracy"])' "$work/teacher.jsonl")
say "teacher: cnn, test accuracy $teacher_acc"

head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
reg=$(bash "$root/hpc/etcd/etcd.sh" up --dir "$work/etcd")

# serve N JOB: N teachers of job JOB, teacher i pinned to tcore i; waits until all registered.
serve() {
  local n=$1 job=$2 i
  for ((i = 0; i < n; i++)); do
    rm -f "$work/$job.$i.ready"
    taskset -c "$(tcore "$i")" "$teacher" serve --checkpoint "$work/teacher" --token-file "$work/token" \
      --registry "$reg" --job "$job" --ready-file "$work/$job.$i.ready" >"$work/$job.$i.txt" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    for _ in $(seq 300); do [ -s "$work/$job.$i.ready" ] && break; sleep 0.1; done
    [ -s "$work/$job.$i.ready" ] || { echo "teacher $job.$i did not start" >&2; cat "$work/$job.$i.txt" >&2; exit 1; }
  done
}
stop_teachers() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# student WAY SEED [options]: one student run pinned to the student cores; its metrics in results/.
student() {
  local way=$1 seed=$2
  shift 2
  say "$way seed $seed"
  taskset -c "$student_cores" "$train" --model "$student_model" --epochs "$student_epochs" --seed "$seed" \
    --progress false --log-every 50 --metrics "$res/$way.$seed.jsonl" "$@" >"$res/$way.$seed.txt" 2>&1 || {
    echo "student $way seed $seed failed:" >&2
    tail -n 20 "$res/$way.$seed.txt" >&2
    exit 1
  }
}

say "precomputing the logit table"
"$teacher" precompute --checkpoint "$work/teacher" --out "$work/table.h5" >"$work/precompute.txt" 2>&1
svc=(--distill-registry "$reg" --distill-token-file "$work/token" --distill-on-missing wait)

for seed in $(seq 1 "$seeds"); do
  student none "$seed"
  student table "$seed" --distill-table "$work/table.h5"
  student inproc "$seed" --distill-teacher-checkpoint "$work/teacher"
done
serve 1 one
for seed in $(seq 1 "$seeds"); do student service1 "$seed" "${svc[@]}" --distill-job one; done
stop_teachers
serve 2 two
for seed in $(seq 1 "$seeds"); do student service2 "$seed" "${svc[@]}" --distill-job two; done
stop_teachers

# The autoscaler: starts from one teacher and may use every teacher core (two slots on one core when only
# one is left for teachers, as service2 does).
slots=$(IFS=';'; echo "${tcores[*]}")
[ "${#tcores[@]}" -ge 2 ] || slots="${tcores[0]};${tcores[0]}"
nslots=$(($(tr -cd ';' <<<"$slots" | wc -c) + 1))
"$teacher" autoscale --checkpoint "$work/teacher" --token-file "$work/token" --registry "$reg" --job auto \
  --cpus "$slots" --min-teachers 1 --max-teachers "$nslots" --target-wait 0.05 \
  --interval 0.5 --cooldown 2 --events "$res/autoscale.events.jsonl" >"$work/autoscale.txt" 2>&1 &
scaler=$!
pids+=("$scaler")
sleep 2
for seed in $(seq 1 "$seeds"); do student autoscale "$seed" "${svc[@]}" --distill-job auto; done
stop_teachers

/usr/bin/python3 "$here/distill_report.py" "$res" "$out" --teacher-accuracy "$teacher_acc" \
  --student-cores "$student_cores" --teacher-cores "$teacher_cores" --student-model "$student_model" \
  --student-epochs "$student_epochs" --plot "$root/docs/img/distill.png"
cp "$res/autoscale.events.jsonl" "${out%.json}.autoscale.jsonl"
/usr/bin/python3 "$here/plot_autoscale.py" "$res/autoscale.events.jsonl" "$root/docs/img/distill_autoscale.png" \
  --target 0.05
