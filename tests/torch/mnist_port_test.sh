#!/usr/bin/env bash
# The MNIST port (examples/torch/mnist/main.py: pytorch/examples' mnist/main.py with a few lines of Sinew, on
# Fashion-MNIST) under failures, on a subset (4096 training, 1000 test images), 4 ranks, 1 epoch, the
# script's own options --epochs 1 --batch-size 32 --lr 1.0 (32 steps), each job with a deadline:
#   clean       no failure: the reference accuracy
#   kill        rank 2 SIGKILLed in backward at step 10: recovered in place, a replacement spawned
#   kill-rank0  rank 0 SIGKILLed in forward at step 20: the same, the new rank 0 carries on
#   lr0         --lr 0, no failure: the model must stay at chance, so the script took --lr (Sinew has an
#               --lr of its own, which must not have swallowed it)
# Each: exit 0, every sample exactly once (mpi_scripts/check-audit.py), the metrics (tests/cli/check_run.py:
# failures, recovery, final world size 4, Sinew's view of the script's batch 32 and 32 steps), one "Test set"
# line from each rank, all the same (the replicas agree, the replacement's too), and its accuracy: the killed
# runs within 3 points of the clean run's. The script's own options: batch 32 (its "Train Epoch: 1
# [320/4096" line at --log-interval 10), 1 epoch (one "Test set" line per rank), --lr (lr0), --save-model
# (mnist_cnn.pt in the run directory).
#
# Why 4096 images and not fewer: a kill changes the run's dropout masks from that step on (the survivors
# and the replacement do not replay the random stream of the failure-free run), so a killed run is another
# draw of the training noise. With 2048 images (16 steps) the script's seeds 1-4 gave 72.4, 68.6, 69.5,
# 68.4% and killed runs up to 5 points below seed 1's: a 3-point bar would fail by chance. With 4096 images
# seeds 1-3 gave 75.8, 75.5, 76.0% and kills at steps 10, 20, 24 gave 76.3, 77.0, 76.9%.
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
train_size=4096
script_args=(--epochs 1 --batch-size 32 --lr 1.0 --log-interval 10)
steps=$((train_size / (ranks * 32)))  # 32
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

# The "Test set: Average loss: L, Accuracy: C/T" lines of an output (the ranks' lines may be interleaved):
# prints the last one's accuracy in percent ("none" without one); exit 1 unless there is exactly one per
# rank (one epoch) and all are the same (the ranks hold the same model).
accuracy() {
  "$python" -c '
import re, sys
found = re.findall(r"Test set: Average loss: ([0-9.]+), Accuracy: (\d+)/(\d+)", open(sys.argv[1]).read())
print("%.2f" % (100.0 * int(found[-1][1]) / int(found[-1][2])) if found else "none")
sys.exit(len(found) != int(sys.argv[2]) or len(set(found)) != 1)' "$1" $ranks
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
  acc=$(accuracy "$run/out.txt") \
    || problems+=("not one 'Test set' line per rank, all the same: $(grep -o 'Test set: [^)]*)' "$run/out.txt" |
                  sort | uniq -c | tr -s ' \n' ' ')")
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
      # The script's own options took effect: batch 32 per rank (sample 320 at batch 10 of 32, 31%), one
      # epoch (one "Test set" line from each rank, checked above), --save-model (rank 0 wrote the model where
      # the script runs).
      echo "-- the script's options: batch 32, 1 epoch, --save-model"
      grep -q "Train Epoch: 1 \[320/$train_size (31%)\]" "$run/out.txt" \
        || problems+=("no 'Train Epoch: 1 [320/$train_size (31%)]' line: the script's batch is not 32")
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

scenario clean 120 --failures 0 -- "${script_args[@]}" --save-model --
scenario kill 150 --failures 1 --event recovered --event grow -- "${script_args[@]}" -- --inject-fault 2:backward:10
scenario kill-rank0 150 --failures 1 --event recovered --event grow -- "${script_args[@]}" -- --inject-fault 0:forward:20
scenario lr0 120 --failures 0 -- --epochs 1 --batch-size 32 --lr 0 --
rm -f "$workdir/run/mnist_cnn.pt"

[ $failed -eq 0 ] && echo "PASS: mnist_port" || echo "FAIL: mnist_port"
exit $failed
