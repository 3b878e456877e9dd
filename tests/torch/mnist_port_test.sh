#!/usr/bin/env bash
# The MNIST port (examples/torch/mnist/main.py: pytorch/examples' mnist/main.py with six lines of Sinew, on
# Fashion-MNIST) under failures, on a subset (2048 training, 1000 test images), 4 ranks, 1 epoch, the
# script's own options --epochs 1 --batch-size 32 --lr 0.5 (16 steps), each job with a deadline:
#   clean       no failure: the reference accuracy
#   kill        rank 2 SIGKILLed in backward at step 6: recovered in place, a replacement spawned
#   kill-rank0  rank 0 SIGKILLed in forward at step 9: the same, the new rank 0 carries on
#   lr0         --lr 0, no failure: the model must stay at chance, so the script took --lr (Sinew has an
#               --lr of its own, which must not have swallowed it)
# Each: exit 0, every sample exactly once (mpi_scripts/check-audit.py), the metrics (tests/cli/check_run.py:
# failures, recovery, final world size 4, Sinew's view of the script's batch 32 and 16 steps), the last
# "Test set" line's accuracy: the killed runs within 3 points of the clean run's. The script's own options:
# batch 32 (its "Train Epoch: 1 [320/2048" line at --log-interval 10), 1 epoch (one "Test set" line per
# rank), --lr (lr0), --save-model (mnist_cnn.pt in the run directory).
#
# Usage: mnist_port_test.sh WORKDIR PYTHON PYTHONPATH MPIEXEC [MPIEXEC_FLAGS...]
#   PYTHON: with torch and torchvision; the data subset is written once under WORKDIR/data (from Debian's
#   dataset-fashion-mnist, examples/torch/mnist/prepare_data.sh) and the jobs run in WORKDIR/run, where
#   main.py finds it as '../data'.
# Exit codes: 0 passed, 1 failed, 77 skipped (torchvision or the Fashion-MNIST files missing).
set -u
workdir=$1
python=$2
export PYTHONPATH=$3
shift 3
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
example=$root/examples/torch/mnist
export OMP_NUM_THREADS=1  # one torch thread per rank: 4 ranks may share 2 cores

ranks=4
train_size=2048
script_args=(--epochs 1 --batch-size 32 --lr 0.5 --log-interval 10)
steps=$((train_size / (ranks * 32)))  # 16
tolerance=3  # accuracy points a killed run may lose against the clean one, on this small subset

if ! "$python" -c "import torch, torchvision" 2>/dev/null; then
  echo "SKIP: $python lacks torch or torchvision"
  exit 77
fi
mkdir -p "$workdir/run"
timeout -k 5 120 bash "$example/prepare_data.sh" "$workdir/data" --limit-train $train_size --limit-test 1000
case $? in
  0) ;;
  *) echo "SKIP: prepare_data.sh could not write the data (is Debian's dataset-fashion-mnist installed?)"
     exit 77 ;;
esac
d=$(mktemp -d -p "$workdir")
trap "[ -n \"\${KEEP:-}\" ] || rm -rf \"\$d\"" EXIT

# The last "Test set: ... Accuracy: C/T" of an output, in percent (the ranks' lines may be interleaved).
accuracy() {
  "$python" -c '
import re, sys
found = re.findall(r"Test set: Average loss: [0-9.]+, Accuracy: (\d+)/(\d+)", open(sys.argv[1]).read())
print("%.2f" % (100.0 * int(found[-1][0]) / int(found[-1][1])) if found else "none")' "$1"
}

failed=0
clean_accuracy=
# scenario NAME DEADLINE_S CHECK_RUN_ARGS -- SCRIPT_ARGS... -- SINEW_OPTIONS...: one job of main.py and its checks.
scenario() {
  local name=$1 deadline=$2
  shift 2
  local checks=() args=()
  while [ "$1" != -- ]; do checks+=("$1"); shift; done
  shift
  while [ "$1" != -- ]; do args+=("$1"); shift; done
  shift
  local run=$d/$name
  mkdir -p "$run"
  rm -f "$workdir/run/mnist_cnn.pt"
  echo "== $name: main.py ${args[*]}; SINEW_OPTIONS: $*"
  local t0=$SECONDS
  (cd "$workdir/run" &&
    SINEW_OPTIONS="--progress false --audit-dir $run/audit --metrics $run/metrics.jsonl $*" \
      timeout -k 5 "$deadline" "${mpiexec[@]}" -n $ranks -x SINEW_OPTIONS -x PYTHONPATH -x OMP_NUM_THREADS \
      "$python" "$example/main.py" "${args[@]}" >"$run/out.txt" 2>&1)
  local rc=$? problems=()
  local acc
  acc=$(accuracy "$run/out.txt")
  echo "exit $rc after $((SECONDS - t0)) s, test accuracy $acc%"
  [ $rc -eq 0 ] || problems+=("the job exited with $rc$([ $rc -eq 124 ] && echo " (its ${deadline} s deadline)")")
  echo "-- audit: every sample exactly once"
  python3 "$root/mpi_scripts/check-audit.py" "$run/audit" --dataset-size $train_size --epochs 1 \
    || problems+=("the audit")
  echo "-- metrics: ${checks[*]}"
  if [ -f "$run/metrics.jsonl" ]; then
    python3 "$root/tests/cli/check_run.py" "$run/metrics.jsonl" --final-world-size $ranks \
      --field start.batch_size=32 --field start.steps=$steps --field done.epochs=1 "${checks[@]}" \
      || problems+=("the metrics")
  else
    problems+=("no metrics file")
  fi
  case $name in
    clean)
      # The script's own options took effect: batch 32 per rank (sample 320 at batch 10 of 16), one epoch
      # (one "Test set" line from each rank), --save-model (rank 0 wrote the model where the script runs).
      echo "-- the script's options: batch 32, 1 epoch, --save-model"
      grep -q 'Train Epoch: 1 \[320/2048 (62%)\]' "$run/out.txt" || problems+=("no 'Train Epoch: 1 [320/2048' line")
      local lines
      lines=$(grep -o 'Test set:' "$run/out.txt" | wc -l)
      [ "$lines" -eq $ranks ] || problems+=("$lines 'Test set' lines, expected $ranks (one epoch on each rank)")
      [ -s "$workdir/run/mnist_cnn.pt" ] || problems+=("--save-model: no mnist_cnn.pt")
      clean_accuracy=$acc
      [ "$acc" != none ] && "$python" -c "import sys; sys.exit(float(sys.argv[1]) < 40)" "$acc" \
        || problems+=("accuracy $acc%: the model did not train")
      ;;
    lr0)
      # Adadelta with lr 0 leaves the weights as initialised: accuracy near chance (10%).
      echo "-- --lr 0 reached the script's optimizer: accuracy at chance"
      [ "$acc" != none ] && "$python" -c "import sys; sys.exit(float(sys.argv[1]) > 30)" "$acc" \
        || problems+=("accuracy $acc% with --lr 0: the script did not take --lr")
      ;;
    *)
      echo "-- accuracy within $tolerance points of the clean run's ${clean_accuracy:-?}%"
      if [ "$acc" = none ] || [ -z "$clean_accuracy" ] || [ "$clean_accuracy" = none ]; then
        problems+=("no accuracy to compare")
      elif ! "$python" -c "import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > float(sys.argv[3]))" \
          "$acc" "$clean_accuracy" $tolerance; then
        problems+=("accuracy $acc% is more than $tolerance points from the clean run's $clean_accuracy%")
      fi
      ;;
  esac
  if [ ${#problems[@]} -eq 0 ]; then
    echo "PASS $name"
  else
    echo "FAIL $name: $(printf '%s; ' "${problems[@]}")"
    echo "---- last lines of the job's output ----"
    grep -v '^Train Epoch\|^$' "$run/out.txt" | tail -n 30
    failed=1
  fi
}

scenario clean 90 --failures 0 -- "${script_args[@]}" --save-model --
scenario kill 120 --failures 1 --event recovered --event grow -- "${script_args[@]}" -- --inject-fault 2:backward:6
scenario kill-rank0 120 --failures 1 --event recovered --event grow -- "${script_args[@]}" -- --inject-fault 0:forward:9
scenario lr0 90 --failures 0 -- --epochs 1 --batch-size 32 --lr 0 --
rm -f "$workdir/run/mnist_cnn.pt"

[ $failed -eq 0 ] && echo "PASS: mnist_port" || echo "FAIL: mnist_port"
exit $failed
