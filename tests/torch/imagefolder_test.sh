#!/usr/bin/env bash
# The ImageFolder example (examples/torch/imagefolder/train.py: the script's own loop, DataLoader worker
# processes, PNG files decoded by PIL) under failures and resizes, each job with a deadline so that a hang
# fails the test:
#   kill        3 ranks, 2 workers each, rank 1 killed in backward: recovered in place, a replacement spawned
#   resize      4 ranks, 2 workers each, the job server's schedule: 2 ranks leave, later 2 are spawned
#   kill-rank0  3 ranks, 2 workers each, rank 0 killed in forward: another rank reports the result
# Each: exit 0, every sample exactly once per epoch (mpi_scripts/check-audit.py), the metrics' events and final
# world size (tests/cli/check_run.py), and rank 0's RESULT line (an accuracy above chance).
#
# Usage: imagefolder_test.sh WORKDIR PYTHON PYTHONPATH MPIEXEC [MPIEXEC_FLAGS...]
#   PYTHON: with torch, torchvision and PIL; the image tree is made once under WORKDIR/images and reused.
# Exit codes: 0 passed, 1 failed, 77 skipped (PIL, numpy or torchvision missing).
set -u
workdir=$1
python=$2
export PYTHONPATH=$3
shift 3
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
example=$root/examples/torch/imagefolder
export OMP_NUM_THREADS=1  # one torch thread per rank: the ranks and their workers share the cores

# 60 training images per class, 2 epochs, batch 16 per rank: 600 samples, 13 steps per epoch at 3 ranks.
per_class=60
train_size=$((per_class * 10))
epochs=2
train_args=(--epochs $epochs --batch-size 16 --lr 0.05 --workers 2)

if ! "$python" -c "import numpy, PIL, torchvision" 2>/dev/null; then
  echo "SKIP: $python lacks numpy, PIL or torchvision"
  exit 77
fi
mkdir -p "$workdir"
timeout -k 5 120 "$python" "$example/make_images.py" --out "$workdir/images/train" --per-class $per_class \
  --test-per-class 20 || { echo "FAIL: make_images.py: exit $?"; exit 1; }
d=$(mktemp -d -p "$workdir")
trap "[ -n \"\${KEEP:-}\" ] || rm -rf \"\$d\"" EXIT

failed=0
# scenario NAME RANKS DEADLINE_S CHECK_RUN_ARGS -- SINEW_OPTIONS...: one job of train.py and its checks.
scenario() {
  local name=$1 n=$2 deadline=$3
  shift 3
  local checks=()
  while [ "$1" != -- ]; do checks+=("$1"); shift; done
  shift
  local run=$d/$name
  mkdir -p "$run"  # --metrics writes into an existing directory
  echo "== $name: $n ranks, sinew options: $*"
  SINEW_OPTIONS="--progress false --timeout-ms 30000 --audit-dir $run/audit --metrics $run/metrics.jsonl $*" \
    timeout -k 5 "$deadline" "${mpiexec[@]}" -n "$n" -x SINEW_OPTIONS -x PYTHONPATH -x OMP_NUM_THREADS \
    "$python" "$example/train.py" --data "$workdir/images" "${train_args[@]}" >"$run/out.txt" 2>&1
  local rc=$? problems=()
  grep -E '^epoch [0-9]+:' "$run/out.txt"
  [ $rc -eq 0 ] || problems+=("the job exited with $rc$([ $rc -eq 124 ] && echo " (its ${deadline} s deadline)")")
  echo "-- audit: every sample exactly once per epoch"
  python3 "$root/mpi_scripts/check-audit.py" "$run/audit" --dataset-size $train_size --epochs $epochs \
    || problems+=("the audit")
  echo "-- metrics: ${checks[*]}"
  if [ -f "$run/metrics.jsonl" ]; then
    python3 "$root/tests/cli/check_run.py" "$run/metrics.jsonl" "${checks[@]}" || problems+=("the metrics")
  else
    echo "no metrics file"
    problems+=("no metrics")
  fi
  echo "-- RESULT: printed once, accuracy above chance (>= 20%)"
  "$python" - "$run/out.txt" <<'PY' || problems+=("the RESULT line")
import json, re, sys
# The ranks' outputs share one file: another process's text may land on the RESULT line, before or after the
# object (seen once in CI: "Extra data" after it). The object itself is one write: decode it where it starts.
decode = json.JSONDecoder().raw_decode
results = [decode(l, m.end() - 1)[0] for l in open(sys.argv[1]) for m in [re.search(r"RESULT \{", l)] if m]
if len(results) != 1:
    sys.exit(f"{len(results)} RESULT lines, expected 1")
r = results[0]
print(f"accuracy {100 * r['accuracy']:.1f}%, {r['steps']} steps, world {r['world_size']}, "
      f"{r['samples_per_s']:.0f} samples/s, {r['dropped']} iterations dropped, {r['recoveries']} recoveries")
sys.exit(0 if r["accuracy"] >= 0.2 else "the accuracy is at chance: the model did not train")
PY
  if [ ${#problems[@]} -eq 0 ]; then
    echo "PASS $name"
  else
    echo "FAIL $name: $(printf '%s; ' "${problems[@]}")"
    echo "---- last lines of the job's output ----"
    tail -n 30 "$run/out.txt"
    failed=1
  fi
}

scenario kill 3 150 --failures 1 --final-world-size 3 -- --inject-fault 1:backward:5
# 4 x 16 per step: at step 6 (epoch 1) 2 ranks leave, at step 14 (epoch 2) 2 are spawned.
scenario resize 4 150 --failures 0 --event shrink --event grow --final-world-size 4 -- --resize-schedule 6:2,14:4
scenario kill-rank0 3 150 --failures 1 --final-world-size 3 -- --inject-fault 0:forward:16

[ $failed -eq 0 ] && echo "PASS: imagefolder" || echo "FAIL: imagefolder"
exit $failed
