#!/usr/bin/env bash
# PyTorch models trained through the sinew package (tests/torch/train_job.py), under mpirun, each job with a
# deadline so that a hang fails the scenario.
#
# Usage: torch_scenarios.sh SCENARIO WORKDIR PYTHON PYTHONPATH MPIEXEC [MPIEXEC_FLAGS...]
#   equivalence        4 ranks with batch b (ring) reach the parameters of 1 process with batch 4b
#   reference          the failure-free 4-rank run the kill scenarios compare with (a fixture)
#   forward, backward, optimizer, allreduce, checkpoint-write
#                      kill -9 of a rank at that phase: recovered in place, a Python replacement spawned,
#                      the audit exact, the final parameters the failure-free run's
#   spare              the killed rank's place taken by a hot spare
#   resize             the job server's schedule: ranks leave at one step, Python processes spawned at another
#   sampler-api        the Horovod-style loop (ElasticSampler, @job.elastic) with a kill in backward
#   checkpoint         written on 4 ranks, resumed on 3, read by key with h5py, exported for torch.load
#   algorithms         every --algorithm on a torch model: within 1 point of ring's accuracy
#   torch-optimizer    torch.optim.SGD equals Sinew's SGD; torch.optim.Adam's state survives a kill
#   restart-debian     restart mode (sinew-supervise) under Debian's Open MPI 4.1, a rank killed
#   pip-install        pip install from the source tree without a network; a job from the installed copy
#   bad-input          an unknown sinew.init() keyword, different models on the ranks, a float64 model,
#                      another model's checkpoint
# The script's own loop (tests/torch/own_loop.py: zero_grad/backward/step, torch.optim, StepLR, DataLoader):
#   loop-equivalence   4 ranks with batch b reach the parameters of 1 process with batch 4b
#   loop-reference     the failure-free 4-rank run the loop-kill scenarios compare with (a fixture)
#   loop-shard         --shard optimizer and gradients with AdamW (two parameter groups): bit for bit the whole
#                      state's run; a kill -9 recovered in place from the shards' replicas; clipping with
#                      sharded gradients (model.clip_grad_norm_; torch's own function fails loudly)
#   loop-zero3         --shard parameters (ZeRO-3): bit for bit the whole state's run at R = 2 and 1; kill -9 of
#                      rank 0, of a rank in its update, of two ranks, of a replica holder during the recovery:
#                      in place, audit exact, the failure-free parameters; clipping; a checkpoint of sharded
#                      parameters read by h5py and resumed at 3 ranks (ZeRO-1) and 2 (unsharded)
#   loop-zero3-more    --shard parameters: an nn.Embedding unit not gathered for backward, its gradient written in
#                      place, its forward gathering its rows, bit for bit the whole state; a tied head; units
#                      called against their index order, released in backward by the forward's order; with
#                      bytegrad bit for bit --shard gradients with bytegrad, also after a kill -9
#   loop-memlimit      a model over the per-rank memory limit (a cgroup per rank): unsharded it fails at start
#                      naming the stage it needs; shard="parameters" trains within it and survives a kill -9; a
#                      model that trains at R = 1 but does not fit whole at the end stays sharded, its end
#                      checkpoint bit for bit the unlimited run's model
#   loop-kill          kill -9 of a rank in forward, backward and the optimizer's step (2 DataLoader workers),
#                      and of rank 0: in place, audit exact, parameters, BatchNorm's statistics, the scheduler
#                      and the learning rate those of the failure-free run (num_batches_tracked exactly)
#   loop-spare         the killed rank's place taken by a hot spare
#   loop-resize        the job server's schedule with DataLoader workers: audit exact, replicas equal
#   loop-checkpoint    stopped at 4 ranks, resumed at 3: the scheduler's state comes from the checkpoint
#   loop-traps         the habits that must fail loudly (exit 2, a message that says what to do) or work
#   resnet-example     examples/torch/train_resnet.py with rank 0 killed, the audit exact
#   legacy-traps       the step-function APIs: the probe leaves no trace in the buffers, optimizer.step() in a
#                      step function, sampler=state.sampler
# Exit codes: 0 passed, 1 failed.
set -u
scenario=$1
workdir=$2
python=$3
export PYTHONPATH=$4
shift 4
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
job=$here/train_job.py
train_size=1024
epochs=2

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
trap "[ -n \"\${KEEP:-}\" ] || rm -rf \"\$d\"" EXIT

# run N DEADLINE_S [train_job options] -- [sinew options]: the job; its output in $d/out.txt.
run() {
  local n=$1 deadline=$2
  shift 2
  timeout -k 5 "$deadline" "${mpiexec[@]}" -n "$n" -x PYTHONPATH "$python" "$job" "$@" >"$d/out.txt" 2>&1
}
# The sinew options every scenario shares: synthetic 1x8x8 data (1024 samples), a constant lr.
common=(--dataset synthetic
        --lr-schedule constant --warmup-steps 0 --progress false --log-every 8 --timeout-ms 30000)
std=(--limit-train $train_size --epochs $epochs --batch-size 16 --lr 0.05)  # unless a scenario says otherwise

fail() {
  echo "FAIL $scenario: $*"
  echo "---- last lines of the job's output ----"
  tail -n 40 "$d/out.txt"
  exit 1
}

# compare A B TOLERANCE: two saved parameter dicts (by name), largest relative difference.
compare() {
  "$python" - "$1" "$2" "$3" <<'PY'
import sys, torch
a, b, tol = torch.load(sys.argv[1]), torch.load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys(), f"parameters {sorted(b)}, the reference has {sorted(a)}"
for k in a:
    assert a[k].shape == b[k].shape, f"{k}: {list(b[k].shape)}, the reference's {list(a[k].shape)}"
worst = max(((a[k] - b[k]).abs() / (1 + a[k].abs())).max().item() for k in a)
print(f"final parameters: largest relative difference {worst:.2e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else "FAIL: the parameters differ")
PY
}

audit() {
  python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $train_size --epochs $epochs
}

# loop N DEADLINE [own_loop.py options] -- [sinew options]: the script's own loop, Sinew's options in the
# environment as sinew-run gives them (the script's argparse sees only its own); output in $d/out.txt.
loop() {
  local n=$1 deadline=$2 mine=() opts=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do mine+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  opts=("$@")
  SINEW_OPTIONS="${opts[*]}" timeout -k 5 "$deadline" "${mpiexec[@]}" -n "$n" -x PYTHONPATH -x SINEW_OPTIONS \
    "$python" "$here/own_loop.py" "${mine[@]}" >"$d/out.txt" 2>&1
  rc=$?  # (for expect_error)
  return $rc
}
# compare_loop REF GOT TOLERANCE: parameters and float buffers within the tolerance; integer buffers, the
# learning rates and the scheduler's state exactly.
compare_loop() {
  "$python" - "$1" "$2" "$3" <<'PY'
import sys, torch
a, b, tol = torch.load(sys.argv[1]), torch.load(sys.argv[2]), float(sys.argv[3])
worst = 0.0
for part in ("params", "buffers"):
    assert a[part].keys() == b[part].keys(), f"{part}: {sorted(b[part])}, the reference has {sorted(a[part])}"
    for k in a[part]:
        x, y = a[part][k], b[part][k]
        if x.is_floating_point():
            worst = max(worst, ((x - y).abs() / (1 + x.abs())).max().item())
        elif not torch.equal(x, y):
            sys.exit(f"FAIL: {k} is {y.tolist()}, the failure-free run's {x.tolist()} (a step counted twice?)")
assert a["lr"] == b["lr"], f"learning rates {b['lr']}, the failure-free run's {a['lr']}"
for k in ("last_epoch", "_step_count", "_last_lr"):
    assert a["sched"][k] == b["sched"][k], f"scheduler {k} {b['sched'][k]}, the failure-free run's {a['sched'][k]}"
assert not a["opt_step"] or not b["opt_step"] or a["opt_step"] == b["opt_step"], "optimizer step counts differ"
print(f"parameters and buffers: largest relative difference {worst:.2e} (tolerance {tol:g}); integer buffers, "
      f"lr {b['lr']} and the scheduler (last_epoch {b['sched']['last_epoch']}) exact")
sys.exit(0 if worst <= tol else "FAIL: the parameters differ")
PY
}
# expect_error CODE PATTERN WHAT: the last job exited with CODE and said PATTERN.
expect_error() {
  [ "$rc" -eq "$1" ] || fail "$3: exit $rc, expected $1"
  grep -q -- "$2" "$d/out.txt" || fail "$3: no message saying '$2'"
  echo "ok: $3 (exit $rc: $(grep -m1 -o -- "$2.\{0,60\}" "$d/out.txt"))"
}
lcommon=(--dataset synthetic --limit-train $train_size --progress false --log-every 8 --timeout-ms 30000)

case "$scenario" in
  equivalence)
    # No BatchNorm (batch statistics differ with the batch), 20 steps, sgd with momentum.
    run 1 120 --model mlp --params-out "$d/one.pt" -- "${common[@]}" --limit-train $train_size --epochs 1 --batch-size 64 --lr 0.05 --max-steps 20 \
      || fail "1 process: exit $?"
    run 4 120 --model mlp --params-out "$d/four.pt" -- "${common[@]}" --limit-train $train_size --epochs 1 --batch-size 16 --lr 0.05 --max-steps 20 \
      --allreduce ring || fail "4 ranks: exit $?"
    compare "$d/one.pt" "$d/four.pt" 1e-5 || fail "parameters"
    ;;
  reference)
    run 4 180 --model cnn --params-out "$d/params.pt" -- "${common[@]}" "${std[@]}" --metrics "$d/metrics.jsonl" \
      --audit-dir "$d/audit" || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 0 --final-world-size 4 || fail "metrics"
    audit || fail "audit"
    cp "$d/params.pt" "$workdir/reference-params.pt"
    ;;
  forward | backward | optimizer | allreduce | checkpoint-write)
    extra=()
    if [ "$scenario" = checkpoint-write ]; then extra=(--checkpoint-dir "$d/ckpt" --checkpoint-every 10); fi
    run 4 180 --model cnn --params-out "$d/params.pt" -- "${common[@]}" "${std[@]}" --metrics "$d/metrics.jsonl" \
      --audit-dir "$d/audit" --inject-fault "2:$scenario:20" "${extra[@]}" || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event shrink --event grow \
      --event recovered --final-world-size 4 || fail "metrics"
    grep -q "spawned as rank" "$d/out.txt" || fail "no replacement was spawned"
    audit || fail "audit"
    compare "$workdir/reference-params.pt" "$d/params.pt" 1e-4 || fail "parameters"
    ;;
  sampler-api)
    # The Horovod-style loop (job.state, @job.elastic, sinew.data.ElasticSampler) instead of job.run: a kill
    # in backward is recovered in place and the result is job.run's failure-free one.
    run 4 180 --model cnn --api sampler-probe --params-out "$d/params.pt" -- "${common[@]}" "${std[@]}" \
      --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --inject-fault "2:backward:20" || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered --final-world-size 4 \
      || fail "metrics"
    audit || fail "audit"
    compare "$workdir/reference-params.pt" "$d/params.pt" 1e-4 || fail "parameters"
    ;;
  resize)
    # The job server's schedule on a torch job: 2 ranks leave at step 8 (not a failure: they exit 0), 2 Python
    # processes are spawned at step 20; the lr follows the global batch (linear scaling); the audit exact.
    run 4 180 --model cnn -- "${common[@]}" "${std[@]}" --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" \
      --resize-schedule 8:2,20:4 --lr-scaling linear || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 0 --event shrink --event grow \
      --field shrink.reason=leave --final-world-size 4 || fail "metrics"
    audit || fail "audit"
    ;;
  spare)
    run 5 180 --model cnn --params-out "$d/params.pt" -- "${common[@]}" "${std[@]}" --metrics "$d/metrics.jsonl" \
      --audit-dir "$d/audit" --spares 1 --inject-fault "1:backward:20" || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered \
      --final-world-size 4 || fail "metrics"
    grep -q "spawned as rank" "$d/out.txt" && fail "a process was spawned although a spare was there"
    audit || fail "audit"
    compare "$workdir/reference-params.pt" "$d/params.pt" 1e-4 || fail "parameters"
    ;;
  checkpoint)
    # 4 ranks stop after 40 of 48 steps (checkpoints every 10); 3 ranks resume from the newest and finish.
    # The 4 ranks use the sampler loop without a probe (flat buffers in the module's order), the later runs
    # job.run (backward's order): the checkpoint is read tensor by tensor into the other layout, which
    # 2 ranks that resume and stop at once show: the same test accuracy at step 40.
    acc() { sed -n 's/.*done: .* test accuracy \([0-9.]*\)%.*/\1/p' "$d/out.txt" | tail -n 1; }
    run 4 180 --model cnn --api sampler -- "${common[@]}" --limit-train $train_size --epochs 3 --batch-size 16 --lr 0.05 --max-steps 40 \
      --checkpoint-dir "$d/ckpt" --checkpoint-every 10 \
      || fail "4 ranks: exit $?"
    at40=$(acc)
    run 2 180 --model cnn -- "${common[@]}" --limit-train $train_size --epochs 3 --batch-size 16 --lr 0.05 --max-steps 40 \
      --checkpoint-dir "$d/ckpt" --checkpoint-every 1000 --resume auto \
      || fail "2 ranks, resumed in the other layout: exit $?"
    grep -q "bucket order: backward's" "$d/out.txt" || fail "job.run did not probe the bucket order"
    [ -n "$at40" ] && [ "$(acc)" = "$at40" ] \
      || fail "step 40 resumed in the other layout: test accuracy $(acc) %, the 4 ranks had $at40 %"
    echo "step 40: $at40 % when written (module's order) and when read into backward's order"
    run 3 180 --model cnn -- "${common[@]}" --limit-train $train_size --epochs 3 --batch-size 16 --lr 0.05 \
      --checkpoint-dir "$d/ckpt" --checkpoint-every 1000 --resume auto \
      || fail "3 ranks: exit $?"
    grep -q -E "resum(ed|ing) .*step 40" "$d/out.txt" || fail "the 3-rank run did not resume from step 40"
    "$python" - "$d/ckpt" "$job" <<'PY' || fail "reading the checkpoint"
import importlib.util, os, sys
import h5py, torch
import sinew.checkpoint as ck
path = ck.manifest(sys.argv[1])
spec = importlib.util.spec_from_file_location("train_job", sys.argv[2])
tj = importlib.util.module_from_spec(spec); spec.loader.exec_module(tj)
net = tj.build("cnn", 1, 8, 8, 10)
with h5py.File(path, "r") as f:  # h5py alone, by the module's own keys and shapes
    for k, t in net.named_parameters():
        got = f["model/" + k]
        assert tuple(got.shape) == tuple(t.shape), (k, got.shape, t.shape)
    for k, b in net.named_buffers():
        if b.dtype == torch.float32:
            assert f["tensors/buffers/" + k].shape == (b.numel(),), k
out = os.path.join(sys.argv[1], "model.pt")
n = ck.export(sys.argv[1], out)
sd = torch.load(out)["model"]
missing, unexpected = net.load_state_dict(sd, strict=False)
assert not unexpected and all(m.endswith("num_batches_tracked") for m in missing), (missing, unexpected)
with h5py.File(path, "r") as f:
    assert torch.equal(net.state_dict()["4.weight"], torch.from_numpy(f["model/4.weight"][...]))
print(f"checkpoint {path}: {n} tensors read by key with h5py, exported and loaded with torch.load")
PY
    ;;
  algorithms)
    # One epoch of the mlp per algorithm, 4 ranks (4096 samples, 64 steps: where every algorithm has
    # converged, so that 1 point tells a broken one); each within 1 point of ring's test accuracy.
    acc() { sed -n 's/.*done: .* test accuracy \([0-9.]*\)%.*/\1/p' "$d/out.txt" | tail -n 1; }
    run 4 180 --model mlp -- "${common[@]}" --batch-size 16 --epochs 1 --limit-train 4096 --lr 0.05 --allreduce ring || fail "ring: exit $?"
    ring=$(acc)
    echo "ring: $ring %"
    for a in "gradient_allreduce --allreduce mpi" "bytegrad --bytegrad-bits 8" "bytegrad --bytegrad-bits 4 --error-feedback true" \
             "bytegrad --bytegrad-bits 2 --error-feedback true" "qadam --optimizer adam --lr 0.005 --qadam-warmup-steps 20" \
             "powersgd" "decentralized" "low_precision_decentralized" "async" "auto"; do
      lr=(--lr 0.05)
      case "$a" in *--lr*) lr=() ;; esac
      # shellcheck disable=SC2086  # the algorithm and its options
      run 4 180 --model mlp -- "${common[@]}" "${lr[@]}" --batch-size 16 --epochs 1 --limit-train 4096 --algorithm $a \
        || fail "$a: exit $?"
      got=$(acc)
      echo "$a: $got %"
      python3 -c "import sys; sys.exit(0 if abs($got - $ring) <= 1.0 else 1)" \
        || fail "$a: test accuracy $got %, ring's $ring %: more than 1 point apart"
    done
    ;;
  torch-optimizer)
    # torch.optim.SGD (momentum 0.9) gives what Sinew's fused SGD gives; torch.optim.Adam's state is
    # part of the replicated state: a kill in backward is recovered to the failure-free run's parameters,
    # and the checkpoint holds optim/exp_avg and optim/exp_avg_sq.
    short=(--limit-train $train_size --epochs 1 --batch-size 16 --lr 0.05 --momentum 0.9 --max-steps 30)
    run 4 120 --model mlp --params-out "$d/fused.pt" -- "${common[@]}" "${short[@]}" || fail "fused sgd: exit $?"
    run 4 120 --model mlp --params-out "$d/torch.pt" --torch-optimizer sgd -- "${common[@]}" "${short[@]}" \
      || fail "torch.optim.SGD: exit $?"
    compare "$d/fused.pt" "$d/torch.pt" 1e-5 || fail "torch.optim.SGD differs from Sinew's SGD"
    adam=(--limit-train $train_size --epochs $epochs --batch-size 16 --lr 0.002)
    run 4 120 --model cnn --params-out "$d/adam.pt" --torch-optimizer adam -- "${common[@]}" "${adam[@]}" \
      --checkpoint-dir "$d/ckpt-ref" --checkpoint-every 1000 || fail "torch.optim.Adam: exit $?"
    run 4 180 --model cnn --params-out "$d/adam-kill.pt" --torch-optimizer adam -- "${common[@]}" "${adam[@]}" \
      --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --inject-fault 2:backward:20 \
      --checkpoint-dir "$d/ckpt" --checkpoint-every 10 || fail "torch.optim.Adam with a kill: exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered --final-world-size 4 \
      || fail "metrics"
    audit || fail "audit"
    compare "$d/adam.pt" "$d/adam-kill.pt" 1e-4 || fail "torch.optim.Adam: the parameters differ after the recovery"
    # Every rank writes its slice of every tensor: the end checkpoints hold the replacement's Adam state too.
    "$python" - "$d/ckpt-ref" "$d/ckpt" <<'PY' || fail "the Adam state after the recovery is not the failure-free run's"
import sys, torch
import sinew.checkpoint as ck
ref, got = ck.read(sys.argv[1]), ck.read(sys.argv[2])
assert sorted(got["optim"]) == ["exp_avg", "exp_avg_sq"], sorted(got["optim"])
for k in ref["optim"]:
    a, b = ref["optim"][k], got["optim"][k]
    worst = ((a - b).abs() / (a.abs() + 1e-3)).max().item()
    print(f"optim/{k}: {a.numel()} elements, largest relative difference {worst:.1e}")
    assert worst <= 1e-3, k
PY
    ;;
  restart-debian)
    # Restart mode under Debian's Open MPI 4.1 (no ULFM), the package built against it (mpi_scripts/test.sh
    # builds it in ompi4/): a rank killed, sinew-supervise relaunches on the 3 surviving slots from the
    # newest checkpoint, and the audit holds across the relaunch.
    export SINEW_SKIP_ULFM=1 PYTHONPATH=$(dirname "$PYTHONPATH")/ompi4/python
    ls "$PYTHONPATH"/sinew/_core*.so >/dev/null 2>&1 || fail "$PYTHONPATH has no sinew package (mpi_scripts/test.sh builds it)"
    timeout -k 5 200 "$root/mpi_scripts/sinew-supervise" -n 4 --events "$d/supervise.jsonl" -- "$python" "$job" \
      --model cnn -- "${common[@]}" "${std[@]}" --elastic restart --inject-fault 2:allreduce:20 \
      --checkpoint-dir "$d/ckpt" --checkpoint-every 10 --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" \
      >"$d/out.txt" 2>&1 || fail "exit $?"
    grep -q '"generation":1' "$d/supervise.jsonl" || fail "no relaunch happened"
    grep -q "Open MPI v4" "$d/out.txt" || grep -q "Open MPI v4" "$d/metrics.jsonl" || fail "not Debian's Open MPI 4"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --event resume --final-world-size 3 || fail "metrics"
    audit || fail "audit"
    ;;
  pip-install)
    # pip from the source tree, no network and no index; then a 2-rank job with a kill from the installed copy.
    tree() { find "$root/python" -not -path '*/__pycache__*' | sort; }
    before=$(tree)
    SINEW_BUILD_DIR=$(cd "$(dirname "$PYTHONPATH")" && pwd) "$python" -m pip install --quiet --no-build-isolation --no-deps \
      --no-index --target "$d/site" "$root/python" >"$d/out.txt" 2>&1 || fail "pip install: exit $?"
    [ "$(tree)" = "$before" ] || fail "pip wrote into the source tree: $(diff <(echo "$before") <(tree))"
    export PYTHONPATH=$d/site
    run 2 120 --model mlp -- "${common[@]}" "${std[@]}" --inject-fault 1:backward:10 || fail "installed: exit $?"
    grep -q "done: 64 steps, .* 1 failures" "$d/out.txt" || fail "the installed package's job did not recover"
    grep -q "$d/site/sinew" <("$python" -c "import sinew; print(sinew.__file__)") || fail "not the installed copy"
    ;;
  bad-input)
    # An option spelled the script's way and not caught: one line and exit 2 (a usage error), no traceback.
    timeout 60 "$python" -c 'import sinew; sinew.init(learning_rate=0.1)' >"$d/out.txt" 2>&1
    rc=$?
    [ $rc -eq 2 ] || fail "an unknown keyword in sinew.init(): exit $rc, expected 2"
    grep -q "^\[sinew\] error: sinew.init(): unknown keyword 'learning_rate'" "$d/out.txt" \
      || fail "an unknown keyword in sinew.init(): no one-line error"
    ! grep -q Traceback "$d/out.txt" || fail "an unknown keyword in sinew.init(): a traceback"
    run 2 120 --model mlp --width-on-rank 1:80 -- "${common[@]}" "${std[@]}"
    rc=$?
    [ $rc -eq 2 ] || fail "different models: exit $rc, expected 2"
    grep -q "the first tensor that does: here 1.weight \[80, 64\], on rank 0 1.weight \[64, 64\]" \
      "$d/out.txt" || fail "different models: the first differing parameter is not named"
    run 2 120 --model mlp --double -- "${common[@]}" "${std[@]}"
    rc=$?
    [ $rc -eq 2 ] || fail "float64 model: exit $rc, expected 2"
    grep -q -i "parameter '1.weight' is double, not float32" "$d/out.txt" || fail "float64 model: no clear error"
    run 2 120 --model cnn -- "${common[@]}" "${std[@]}" --max-steps 10 --checkpoint-dir "$d/ckpt" --checkpoint-every 5 \
      || fail "writing a cnn checkpoint: exit $?"
    before=$(find "$d/ckpt" -type f -exec sha1sum {} + | sort)
    run 2 120 --model mlp -- "${common[@]}" "${std[@]}" --checkpoint-dir "$d/ckpt" --resume auto
    rc=$?
    [ $rc -eq 4 ] || fail "another model's checkpoint: exit $rc, expected 4"
    grep -q "written for another model\|this run needs" "$d/out.txt" || fail "another model's checkpoint: no clear error"
    [ "$(find "$d/ckpt" -type f -exec sha1sum {} + | sort)" = "$before" ] || fail "the checkpoint was changed"
    ;;
  legacy-traps)
    # The step-function APIs: the probe pass before training leaves no trace in BatchNorm's buffers (and a kill's
    # redone step counts its batch once): num_batches_tracked is the number of steps.
    run 4 180 --model cnn -- "${common[@]}" "${std[@]}" --inject-fault 2:forward:11 || fail "cnn: exit $?"
    grep -q "num_batches_tracked \[32, 32\]" "$d/out.txt" || fail "num_batches_tracked is not 32 (probe or redo counted)"
    echo "ok: num_batches_tracked 32 after 32 steps, a probe pass and a redone step"
    run 2 120 --model mlp --torch-optimizer sgd --misuse opt-step -- "${common[@]}" "${std[@]}"
    rc=$?
    expect_error 2 "optimizer.step() in a Job.run/Job.state step function" "optimizer.step() in job.run's step"
    run 2 120 --model mlp --misuse foreign-step -- "${common[@]}" "${std[@]}"
    rc=$?
    expect_error 2 "that Sinew does not know steps the model's parameters" "an unknown optimizer in job.run's step"
    run 2 120 --model mlp --api sampler --misuse sampler-arg -- "${common[@]}" "${std[@]}"
    rc=$?
    expect_error 2 "give it to a DataLoader as batch_sampler=state.sampler, not sampler=" "sampler=state.sampler"
    ;;
  resnet-example)
    # examples/torch/train_resnet.py (the README's PyTorch demonstration) on a little data: rank 0 killed in
    # backward, recovered in place inside the script's loop, the audit exact.
    rm -rf "$d/audit"
    SINEW_OPTIONS="--dataset synthetic --limit-train 384 --progress false --audit-dir $d/audit --metrics $d/m.jsonl \
--inject-fault 0:backward:3" timeout -k 5 300 "${mpiexec[@]}" -n 3 -x PYTHONPATH -x SINEW_OPTIONS "$python" \
      "$root/examples/torch/train_resnet.py" --epochs 2 --batch-size 32 >"$d/out.txt" 2>&1 || fail "exit $?"
    grep -q "done: test accuracy .* 1 failures recovered, 3 ranks at the end" "$d/out.txt" || fail "no recovery"
    python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size 384 --epochs 2 || fail "audit"
    ;;
  loop-equivalence)
    # The global mean gradient when backward() returns: 4 ranks of batch 16 take the steps 1 process takes
    # with batch 64 (an MLP: no BatchNorm, whose statistics are per batch).
    loop 1 120 --model mlp --batch-size 64 --out "$d/one.pt" -- "${lcommon[@]}" || fail "1 process: exit $?"
    loop 4 180 --model mlp --batch-size 16 --out "$d/four.pt" -- "${lcommon[@]}" || fail "4 ranks: exit $?"
    # And one process of Sinew's takes plain PyTorch's steps, bit for bit (a CNN with BatchNorm, SGD with
    # momentum and weight decay, StepLR).
    loop 1 120 --trap plain -- "${lcommon[@]}" || fail "one process is not plain PyTorch: exit $?"
    grep -q "done: 128 steps" "$d/out.txt" || fail "plain: not 128 steps"
    echo "ok: 1 process, 128 steps: parameters and buffers equal plain PyTorch's at every step"
    "$python" - "$d/one.pt" "$d/four.pt" <<'PY' || fail "parameters"
import sys, torch
a, b = torch.load(sys.argv[1]), torch.load(sys.argv[2])
worst = max(((a["params"][k] - b["params"][k]).abs() / (1 + a["params"][k].abs())).max().item() for k in a["params"])
print(f"1 x 64 vs 4 x 16: largest relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-5 else "FAIL: the parameters differ")
PY
    ;;
  loop-reference)
    loop 4 180 --out "$workdir/loop-reference.pt" -- "${lcommon[@]}" --metrics "$d/metrics.jsonl" \
      --audit-dir "$d/audit" || fail "exit $?"
    audit || fail "audit"
    grep -q "done: 32 steps, 0 failures" "$d/out.txt" || fail "not 32 steps"
    # The metrics report the script's optimizer's learning rate (SGD 0.05, halved by its StepLR each epoch), and
    # no loss: Sinew does not see the script's loss tensor, and a zero would read as one.
    "$python" - "$d/metrics.jsonl" <<'PY' || fail "the metrics' learning rate or loss"
import json, sys
steps = [e for e in map(json.loads, open(sys.argv[1])) if "lr" in e and "event" not in e]
assert len(steps) == 4, f"{len(steps)} step records, expected 4 (every 8 of 32 steps)"
for e in steps:
    want = 0.05 if e["epoch"] == 0 else 0.025
    assert abs(e["lr"] - want) < 1e-7 and e["loss"] is None, e
done = [e for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "done"]
# Sinew did not evaluate the model (the script does): no accuracy, not a 0.
assert len(done) == 1 and done[0]["test_accuracy"] is None and done[0]["test_loss"] is None, done
print(f"metrics: lr {sorted({round(e['lr'], 6) for e in steps})} (the script's StepLR), loss null, "
      "test accuracy null")
PY
    ;;
  loop-shard)
    # --shard optimizer in the script's own loop, AdamW with two parameter groups: each rank holds its shards
    # of the optimizer's state; the same parameters as the whole state's, bit for bit; a kill -9 recovered in
    # place from the replicas, as the failure-free run.
    # AdamW's whole state is made in flat tensors up front (its twin is constructible: AdamW's defaults hold
    # an argument its constructor refuses), not moved there at the cost of a copy per key.
    "$python" - <<'PY' || fail "AdamW's state is not made flat"
import torch
from sinew.optim import _flat_state
m = torch.nn.Linear(4, 3)
flat = torch.zeros(15)
named = [("weight", m.weight), ("bias", m.bias)]
opt = torch.optim.AdamW([{"params": [m.weight], "weight_decay": 0.01}, {"params": [m.bias], "weight_decay": 0.0}])
got = _flat_state(opt, flat, named, {id(m.weight): 0, id(m.bias): 12})
assert sorted(got) == ["exp_avg", "exp_avg_sq"], got
PY
    loop 4 180 --optimizer adamw --out "$d/whole.pt" -- "${lcommon[@]}" || fail "whole: exit $?"
    # Each stage: bit for bit the whole state's run (--shard gradients too: at 4 ranks Open MPI's
    # reduce-scatter sums as its allreduce does), and a kill -9 recovered in place from the replicas.
    for stage in optimizer gradients; do
      loop 4 180 --optimizer adamw --out "$d/$stage.pt" -- "${lcommon[@]}" --shard $stage || fail "$stage: exit $?"
      grep -q "optimiser state (AdamW)\( and reduced gradients\)\? sharded over 4 ranks, each shard held by 2" \
        "$d/out.txt" || fail "$stage: not sharded"
      compare_loop "$d/whole.pt" "$d/$stage.pt" 0 || fail "$stage differs from the whole state"
      rm -rf "$d/audit"
      loop 4 180 --optimizer adamw --workers 2 --out "$d/killed-$stage.pt" -- "${lcommon[@]}" --shard $stage \
        --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --inject-fault 2:backward:12 || fail "$stage killed: exit $?"
      python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered \
        --final-world-size 4 >/dev/null || fail "$stage killed: metrics"
      audit || fail "$stage killed: audit"
      compare_loop "$d/whole.pt" "$d/killed-$stage.pt" 1e-4 || fail "$stage killed: state"
    done
    # Clipping with sharded gradients: model.clip_grad_norm_ clips as torch's function does on whole gradients
    # (SGD: AdamW's normalisation turns rounding into 1e-3 after clipping, even between two allreduces);
    # torch's own function over the NaN this rank does not hold fails loudly.
    loop 4 180 --clip 0.1 --out "$d/clip-whole.pt" -- "${lcommon[@]}" || fail "clip whole: exit $?"
    loop 4 180 --clip 0.1 --clip-by model --out "$d/clip-g.pt" -- "${lcommon[@]}" --shard gradients || fail "clip: exit $?"
    compare_loop "$d/clip-whole.pt" "$d/clip-g.pt" 1e-6 || fail "model.clip_grad_norm_ differs from torch's"
    # A kill in backward: the survivors' clip in that iteration (void now) must not sum over the new group,
    # where the replacement is not in that step (it was: MPI_ERR_TRUNCATE, the replacement killed in a loop).
    rm -rf "$d/audit"
    loop 4 180 --clip 0.1 --clip-by model --workers 2 --out "$d/clip-killed.pt" -- "${lcommon[@]}" --shard gradients \
      --audit-dir "$d/audit" --inject-fault 2:backward:12 || fail "clip killed: exit $?"
    audit || fail "clip killed: audit"
    compare_loop "$d/clip-whole.pt" "$d/clip-killed.pt" 1e-4 || fail "clip killed: state"
    loop 4 120 --clip 0.1 --epochs 1 -- "${lcommon[@]}" --shard gradients
    expect_error 2 "clip with model.clip_grad_norm_(max_norm) instead" "torch.nn.utils.clip_grad_norm_ with shard='gradients'"
    ;;
  loop-zero3)
    # --shard parameters (ZeRO-3): each rank keeps its shards of the parameters, gradients and AdamW's state; the
    # model's layers (units) are gathered while they run. Bit for bit the whole state's run at R = 2 and R = 1.
    zopts=(--model deep --optimizer adamw)
    loop 4 180 "${zopts[@]}" --out "$d/whole.pt" -- "${lcommon[@]}" || fail "whole: exit $?"
    for r in 2 1; do
      loop 4 180 "${zopts[@]}" --out "$d/p$r.pt" -- "${lcommon[@]}" --shard parameters --shard-replicas $r \
        || fail "R=$r: exit $?"
      grep -q "reduced gradients and parameters sharded over 4 ranks, each shard held by $r" "$d/out.txt" \
        || fail "R=$r: not sharded"
      compare_loop "$d/whole.pt" "$d/p$r.pt" 0 || fail "R=$r differs from the whole state"
    done
    # The prefetch (default one unit ahead): each unit's gather is handed over while the one before it runs, and
    # waited for when it runs (every prediction hits on this sequential model). None and two ahead: the same bits.
    grep -q "prefetched gathers: \([1-9][0-9]*\), \1 waited for by their unit" "$d/out.txt" \
      || fail "prefetch: not every unit's gather prefetched and used ($(grep -h 'prefetched gathers' "$d/out.txt"))"
    for a in 0 2; do
      loop 4 180 "${zopts[@]}" --out "$d/a$a.pt" -- "${lcommon[@]}" --shard parameters --shard-prefetch $a \
        || fail "prefetch $a: exit $?"
      compare_loop "$d/whole.pt" "$d/a$a.pt" 0 || fail "prefetch $a differs from the whole state"
    done
    grep -q "prefetched gathers: [1-9]" "$d/out.txt" || fail "prefetch 2: nothing prefetched"
    loop 2 120 "${zopts[@]}" --epochs 1 -- "${lcommon[@]}" --shard parameters --shard-prefetch 9
    expect_error 2 "shard-prefetch must be in \[0, 8\]" "--shard-prefetch 9"
    # kill -9 at R = 2, in place, audit exact, the failure-free parameters: rank 0 in backward (the units'
    # gathers inside backward fail); rank 2 in its update (the next forward's gathers fail); ranks 0 and 1 at
    # once (they hold different shards); rank 1, then rank 2 (a replica holder) during the recovery.
    for f in "0:backward:12" "2:optimizer:9" "0:allreduce:10 1:allreduce:10" "1:forward:10 2:recovery:10"; do
      faults=()
      for x in $f; do faults+=(--inject-fault "$x"); done
      rm -rf "$d/audit"
      loop 4 180 "${zopts[@]}" --workers 2 --out "$d/killed.pt" -- "${lcommon[@]}" --shard parameters \
        --audit-dir "$d/audit" "${faults[@]}" || fail "$f: exit $?"
      grep -q "recovered in place" "$d/out.txt" || fail "$f: not recovered in place"
      audit >/dev/null || fail "$f: audit"
      cmp=$(compare_loop "$d/whole.pt" "$d/killed.pt" 1e-6) || fail "$f: state ($cmp)"
      echo "killed at $f: recovered in place, audit exact; $cmp"
    done
    # Both holders of shard 1 (ranks 1 and 3) killed in one step: the job names the shard and exits for
    # sinew-run's relaunch from the newest checkpoint (the fallback), which trains to the end.
    SINEW_OPTIONS="${lcommon[*]} --shard parameters --checkpoint-dir $d/lost --checkpoint-every 5 \
      --inject-fault 1:backward:12 --inject-fault 3:backward:12" timeout -k 5 300 "$root/mpi_scripts/sinew-run" \
      -n 4 --events "$d/supervise.jsonl" -- "$python" "$here/own_loop.py" "${zopts[@]}" >"$d/out.txt" 2>&1 \
      || fail "both holders of a shard killed: exit $?"
    grep -q "shard 1 of 4 .* held by ranks 1, 3 of the failed view, all lost" "$d/out.txt" \
      || fail "both holders of a shard killed: the lost shard not named"
    [ "$(grep -c '"event":"launch"' "$d/supervise.jsonl")" -eq 2 ] && grep -q "job complete" "$d/out.txt" \
      || fail "both holders of a shard killed: not relaunched once and complete"
    echo "both holders of shard 1 killed: named, relaunched from the checkpoint, complete"
    # After the end checkpoint the optimizer state is given back (it has no reader left), so a kill -9 while the
    # model is gathered whole at the end is not recovered in place: the survivors exit for a relaunch from that
    # checkpoint, which finishes at once, with the failure-free run's parameters bit for bit.
    SINEW_OPTIONS="${lcommon[*]} --shard parameters --checkpoint-dir $d/endk --inject-fault 2:end-gather:32" \
      timeout -k 5 300 "$root/mpi_scripts/sinew-run" -n 4 --events "$d/supervise-end.jsonl" -- "$python" \
      "$here/own_loop.py" "${zopts[@]}" --out "$d/endk.pt" >"$d/out.txt" 2>&1 || fail "killed at the end: exit $?"
    grep -q "nothing to reshard in place; the relaunch resumes from that checkpoint" "$d/out.txt" \
      || fail "killed at the end: no relaunch asked for"
    [ "$(grep -c '"event":"launch"' "$d/supervise-end.jsonl")" -eq 2 ] && grep -q "job complete" "$d/out.txt" \
      || fail "killed at the end: not relaunched once and complete"
    compare_loop "$d/whole.pt" "$d/endk.pt" 0 || fail "killed at the end: differs from the whole state"
    echo "killed while the model was gathered whole at the end: relaunched from the end checkpoint, the same bits"
    # Clipping: torch.nn.utils.clip_grad_norm_ over the model is the norm over the group (SGD, as loop-shard).
    loop 4 180 --model deep --clip 0.1 --out "$d/clip-whole.pt" -- "${lcommon[@]}" || fail "clip whole: exit $?"
    loop 4 180 --model deep --clip 0.1 --out "$d/clip-p.pt" -- "${lcommon[@]}" --shard parameters \
      || fail "clip: exit $?"
    compare_loop "$d/clip-whole.pt" "$d/clip-p.pt" 1e-6 || fail "clip_grad_norm_ differs from the whole gradients'"
    loop 2 120 --model deep --trap state-dict --epochs 1 -- "${lcommon[@]}" --shard parameters
    expect_error 2 "state_dict() during training with shard='parameters'" "model.state_dict() in the loop"
    loop 2 120 --model deep --trap module-state-dict --epochs 1 -- "${lcommon[@]}" --shard parameters
    expect_error 2 "state_dict() during training with shard='parameters'" "model.module.state_dict() in the loop"
    # A checkpoint of sharded parameters at 4 ranks holds the whole state's tensors (read with h5py), and loads at
    # 3 ranks with sharded optimizer state and at 2 ranks unsharded as the whole state's checkpoint does.
    for way in none parameters; do
      loop 4 180 "${zopts[@]}" -- "${lcommon[@]}" --shard $way --checkpoint-dir "$d/c-$way" --checkpoint-every 8 \
        --max-steps 16 || fail "checkpoint $way: exit $?"
    done
    "$python" - "$d/c-none" "$d/c-parameters" <<'PY' || fail "the checkpoints' tensors differ"
import sys
from sinew import checkpoint
(sa, _, pa), (sb, _, pb) = checkpoint.committed(sys.argv[1])[-1], checkpoint.committed(sys.argv[2])[-1]
assert sa == sb == 16, (sa, sb)
a, b = checkpoint.read(pa), checkpoint.read(pb)
for part in ("model", "optim"):
    assert a[part].keys() == b[part].keys(), (part, sorted(a[part]), sorted(b[part]))
    for k in a[part]:
        assert a[part][k].equal(b[part][k]), f"{part}/{k} differs"
print(f"step 16: {len(a['model'])} tensors and {len(a['optim'])} optimizer tensors equal, by module key (h5py)")
PY
    for n_stage in "3 optimizer" "2 none"; do
      set -- $n_stage
      for way in none parameters; do
        loop "$1" 180 "${zopts[@]}" --out "$d/r$1-$way.pt" -- "${lcommon[@]}" --shard "$2" \
          --resume "$(ls -d "$d/c-$way"/ckpt-0000000016* | tail -n 1)" || fail "resume $way at $1 ranks: exit $?"
        grep -q "resumed from" "$d/out.txt" || fail "resume $way at $1 ranks: not resumed"
      done
      compare_loop "$d/r$1-none.pt" "$d/r$1-parameters.pt" 0 \
        || fail "resumed at $1 ranks (--shard $2): the sharded checkpoint's run differs"
    done
    ;;
  loop-zero3-more)
    # --shard parameters beyond loop-zero3: an embedding unit, and bytegrad.
    zopts=(--model deep --optimizer adamw)
    loop 4 180 "${zopts[@]}" --out "$d/whole.pt" -- "${lcommon[@]}" || fail "whole: exit $?"
    # A unit that is an nn.Embedding is not gathered again for backward (its gradient reads no weight): the Linear
    # units are, and the end state is the whole state's, bit for bit.
    loop 4 180 --model embed --optimizer adamw --out "$d/e-whole.pt" -- "${lcommon[@]}" || fail "embed whole: exit $?"
    loop 4 180 --model embed --optimizer adamw --out "$d/e-p.pt" -- "${lcommon[@]}" --shard parameters \
      || fail "embed: exit $?"
    grep -q "units gathered again for backward: Linear$" "$d/out.txt" || fail "embed: the embedding was gathered"
    # Its gradient is added into the rows the step's indices name, where it is kept (no dense tensor beside it).
    grep -q "embedding gradients written in place: [1-9]" "$d/out.txt" || fail "embed: a dense embedding gradient"
    # Its forward gathers only the rows the step's indices name, point to point from their owners.
    grep -q "embedding forwards that gathered only their rows: [1-9]" "$d/out.txt" || fail "embed: gathered whole"
    compare_loop "$d/e-whole.pt" "$d/e-p.pt" 0 || fail "embed: differs from the whole state"
    # A head tied to the embedding (a language model's): the weight is read outside the embedding's unit, so it is
    # the root's, whole for the step; bit for bit the whole state.
    loop 4 180 --model tied --optimizer adamw --out "$d/t-whole.pt" -- "${lcommon[@]}" || fail "tied whole: exit $?"
    loop 4 180 --model tied --optimizer adamw --out "$d/t-p.pt" -- "${lcommon[@]}" --shard parameters \
      || fail "tied: exit $?"
    compare_loop "$d/t-whole.pt" "$d/t-p.pt" 0 || fail "tied: differs from the whole state"
    # A forward that calls its units against their index order (a ModuleList run last to first): backward releases
    # a unit when one that ran before it in the forward begins, so at most that unit and the one prefetched are
    # whole at once (the index order's rule kept all 4 until backward ended); bit for bit the whole state.
    loop 4 180 --model reversed --optimizer adamw --out "$d/v-whole.pt" -- "${lcommon[@]}" \
      || fail "reversed whole: exit $?"
    loop 4 180 --model reversed --optimizer adamw --out "$d/v-p.pt" -- "${lcommon[@]}" --shard parameters \
      || fail "reversed: exit $?"
    grep -q "units held whole at once in backward: at most 2 of 4$" "$d/out.txt" \
      || fail "reversed: units kept in backward ($(grep -h 'held whole' "$d/out.txt"))"
    compare_loop "$d/v-whole.pt" "$d/v-p.pt" 0 || fail "reversed: differs from the whole state"
    # kill -9 of rank 2 in forward: the survivors' gather of the embedding's rows fails; recovered in place.
    rm -rf "$d/audit"
    loop 4 180 --model embed --optimizer adamw --workers 2 --out "$d/e-k.pt" -- "${lcommon[@]}" \
      --shard parameters --audit-dir "$d/audit" --inject-fault 2:forward:10 || fail "embed, killed: exit $?"
    grep -q "recovered in place" "$d/out.txt" || fail "embed, killed: not recovered in place"
    audit >/dev/null || fail "embed, killed: audit"
    compare_loop "$d/e-whole.pt" "$d/e-k.pt" 1e-6 || fail "embed, killed: differs from the whole state"
    # ByteGrad with sharded parameters: the same quantised reduce-scatter of the same buckets as with sharded
    # gradients, so bit for bit the ZeRO-2 run with bytegrad (and not the exact run's bits); a kill -9 of rank 0
    # in backward recovers in place to the same bits.
    bg=(--algorithm bytegrad)
    loop 4 180 "${zopts[@]}" --out "$d/bg-g.pt" -- "${lcommon[@]}" --shard gradients "${bg[@]}" \
      || fail "bytegrad, gradients: exit $?"
    loop 4 180 "${zopts[@]}" --out "$d/bg-p.pt" -- "${lcommon[@]}" --shard parameters "${bg[@]}" \
      || fail "bytegrad, parameters: exit $?"
    compare_loop "$d/bg-g.pt" "$d/bg-p.pt" 0 || fail "bytegrad: sharded parameters differ from sharded gradients"
    ! compare_loop "$d/whole.pt" "$d/bg-p.pt" 0 >/dev/null || fail "bytegrad: the exact reduction's bits"
    loop 4 180 "${zopts[@]}" --workers 2 --out "$d/bg-k.pt" -- "${lcommon[@]}" --shard parameters "${bg[@]}" \
      --inject-fault 0:backward:12 || fail "bytegrad, killed: exit $?"
    grep -q "recovered in place" "$d/out.txt" || fail "bytegrad, killed: not recovered in place"
    compare_loop "$d/bg-p.pt" "$d/bg-k.pt" 0 || fail "bytegrad, killed: differs from the failure-free run"
    echo "bytegrad with sharded parameters: bit for bit sharded gradients' run, and after a kill -9"
    ;;
  loop-memlimit)
    # A model whose whole training state does not fit the memory each rank may use: a memory cgroup per rank
    # (own_loop.py --mem-limit), 17 bytes per parameter above what the rank uses after sinew.init(), for a
    # model whose AdamW state takes 16 unsharded, and the rank's own objects about 4 more when training
    # starts. Unsharded it fails at start, naming a stage that fits; with shard="parameters" (R = 2) it trains
    # at 4 ranks within the limit (about 8 per parameter in a step; a recovery makes the new layout's state
    # beside the old one) and survives a kill -9 in place.
    cleanup_cgroups() {  # the ranks' cgroups, empty once they exited
      for g in /sys/fs/cgroup/memory/sinew-test-* /sys/fs/cgroup/sinew-test-*; do
        [ -d "$g" ] && rmdir "$g" 2>/dev/null
      done
      return 0
    }
    trap 'cleanup_cgroups; [ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT
    loop 4 240 --model big --optimizer adamw --mem-limit 17 -- "${lcommon[@]}"
    if [ "$rc" -eq 77 ]; then
      grep -m1 "SKIP" "$d/out.txt"
      exit 77
    fi
    expect_error 2 "per rank with shard='none', more than this rank may use.*shard='\(optimizer\|parameters\)' needs about" \
      "the whole state under the limit"
    rm -rf "$d/audit"
    loop 4 300 --model big --optimizer adamw --mem-limit 17 -- "${lcommon[@]}" --shard parameters \
      --audit-dir "$d/audit" --inject-fault 1:backward:6 || fail "sharded under the limit: exit $?"
    grep -q "recovered in place" "$d/out.txt" || fail "sharded under the limit: not recovered in place"
    audit >/dev/null || fail "sharded under the limit: audit"
    grep -h "memory limit per rank\|peak memory" "$d/out.txt"
    grep -q "a recovery in place needs" "$d/out.txt" && fail "sharded under the limit: warned, with room to recover"
    # A limit with room for the stage but not for a recovery's new layout beside the old (13 bytes per parameter:
    # the stage about 8, the reshard's new state 4 x 2 x 2/3 more): it trains, and rank 0 says at start that a
    # failure could end in a relaunch.
    loop 4 240 --model big --optimizer adamw --mem-limit 13 -- "${lcommon[@]}" --shard parameters --max-steps 6 \
      || fail "sharded, no room to recover: exit $?"
    [ "$(grep -c "warning: a recovery in place needs about .* a failure could end in a relaunch" "$d/out.txt")" -eq 1 ] \
      || fail "sharded, no room to recover: not said once"
    echo "a limit without room for a recovery in place: trains, and says so once"
    # A model that fits a rank in training but not whole at the end, beside what the rank holds (8 ranks, R = 1,
    # 18 small units, SGD with momentum, 5.5 bytes per parameter above what a rank uses after sinew.init(): it
    # peaked about 20 MiB below that in training; at the end, with the momentum given back after the end
    # checkpoint, the model whole needs 3.5 more and the margin of 32 MiB, about 20 MiB over it): it stays
    # sharded after training instead of being killed there, its state_dict() is refused, and the end checkpoint
    # holds the trained model: bit for bit the parameters of the same run without a limit, gathered whole.
    # (At 4 ranks, R = 1, the model whole takes about what training took once the optimizer's state is given
    # back: only more ranks, or R = 1 beside a larger working set, reach this case.)
    loop 8 240 --model long --out "$d/whole.pt" -- "${lcommon[@]}" --shard parameters --shard-replicas 1 \
      || fail "R = 1 without a limit: exit $?"
    grep -q "stays sharded" "$d/out.txt" && fail "R = 1 without a limit: kept sharded"
    loop 8 240 --model long --mem-limit 5.5 -- "${lcommon[@]}" --shard parameters --shard-replicas 1 \
      --checkpoint-dir "$d/ckpt-long" || fail "the model whole over the limit at the end: exit $?"
    grep -q "the trained model stays sharded over the ranks (it does not fit a rank whole); it is the end checkpoint" \
      "$d/out.txt" || fail "the model whole over the limit at the end: not kept sharded"
    grep -q "state_dict() refused: state_dict() after training: the model stayed sharded" "$d/out.txt" \
      || fail "the model whole over the limit at the end: state_dict() not refused"
    grep -q "\[own_loop\] done: 16 steps" "$d/out.txt" || fail "the model whole over the limit at the end: not done"
    "$python" - "$d/ckpt-long" "$d/whole.pt" <<'PY' || fail "the end checkpoint is not the trained model"
import sys, torch
import sinew.checkpoint
got, ref = sinew.checkpoint.state_dict(sys.argv[1]), torch.load(sys.argv[2])["params"]
worst = max((torch.as_tensor(got[k]) - v).abs().max().item() for k, v in ref.items())
print(f"the end checkpoint against the run without a limit: {len(ref)} tensors, largest difference {worst:.1e}")
sys.exit(0 if worst == 0 else 1)
PY
    grep -h "the model whole needs" "$d/out.txt" | head -1
    ;;
  loop-kill)
    for f in 1:forward:9 2:backward:20 3:optimizer:13 0:backward:17; do
      rm -rf "$d/audit"
      loop 4 180 --workers 2 --out "$d/got.pt" -- "${lcommon[@]}" --metrics "$d/metrics.jsonl" \
        --audit-dir "$d/audit" --inject-fault "$f" || fail "$f: exit $?"
      python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered \
        --final-world-size 4 >/dev/null || fail "$f: metrics"
      audit >/dev/null || fail "$f: audit"
      cmp=$(compare_loop "$workdir/loop-reference.pt" "$d/got.pt" 1e-4) || fail "$f: state ($cmp)"
      echo "killed at $f: recovered in place, audit exact; $cmp"
      compare_loop "$workdir/loop-reference.pt" "$d/got.pt" 1e-4 >/dev/null || fail "$f: state differs"
    done
    ;;
  loop-spare)
    loop 5 180 --workers 2 --out "$d/got.pt" -- "${lcommon[@]}" --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" \
      --spares 1 --inject-fault 2:backward:12 || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 1 --event recovered --final-world-size 4 \
      || fail "metrics"
    grep -q "spawned as rank" "$d/out.txt" && fail "a process was spawned although a spare was there"
    audit || fail "audit"
    compare_loop "$workdir/loop-reference.pt" "$d/got.pt" 1e-4 || fail "state"
    ;;
  loop-resize)
    loop 4 180 --workers 2 -- "${lcommon[@]}" --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" \
      --resize-schedule 8:2,20:4 --lr-scaling linear || fail "exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --failures 0 --event shrink --event grow \
      --field shrink.reason=leave --final-world-size 4 || fail "metrics"
    audit || fail "audit"
    grep -q "batches dropped" "$d/out.txt" || fail "no summary line"
    ;;
  loop-checkpoint)
    # 3 epochs of 16 steps: stopped at step 40 (in epoch 3) on 4 ranks, resumed on 3: the StepLR's state and
    # the learning rate come from the checkpoint, and end where the failure-free run's do.
    loop 4 180 --epochs 3 -- "${lcommon[@]}" --checkpoint-dir "$d/ckpt" --checkpoint-every 10 --max-steps 40 \
      --audit-dir "$d/audit" || fail "first part: exit $?"
    loop 3 180 --epochs 3 --out "$d/got.pt" -- "${lcommon[@]}" --checkpoint-dir "$d/ckpt" --resume auto \
      --audit-dir "$d/audit" --metrics "$d/metrics.jsonl" || fail "resumed: exit $?"
    python3 "$root/tests/cli/check_run.py" "$d/metrics.jsonl" --event resume --final-world-size 3 || fail "metrics"
    "$python" - "$d/got.pt" <<'PY' || fail "the scheduler did not resume"
import sys, torch
s = torch.load(sys.argv[1])
want = 0.05 * 0.5 ** 3
print(f"resumed: lr {s['lr'][0]:g} (failure-free: {want:g}), scheduler last_epoch {s['sched']['last_epoch']}")
sys.exit(0 if abs(s["lr"][0] - want) < 1e-12 and s["sched"]["last_epoch"] == 3 else 1)
PY
    python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $train_size --epochs 3 || fail "audit"
    ;;
  loop-traps)
    loop 2 120 --trap bad-keyword -- "${lcommon[@]}"
    [ $rc -eq 0 ] && grep -q "caught sinew.UsageError (exit code 2).*no_such_option" "$d/out.txt" \
      || fail "an unknown keyword is not a catchable sinew.UsageError naming it"
    echo "ok: an unknown keyword of sinew.init() is a sinew.UsageError the script catches"
    loop 2 120 --trap no-backward --epochs 1 -- "${lcommon[@]}" --find-unused-parameters
    expect_error 2 "backward() was not called" "a step without backward(), --find-unused-parameters bare"
    loop 2 120 --trap grad-replaced --epochs 1 -- "${lcommon[@]}"
    expect_error 2 "was replaced by another tensor" ".grad replaced after backward()"
    loop 2 120 --trap step-twice --epochs 1 -- "${lcommon[@]}"
    expect_error 2 "optimizer.step() twice" "optimizer.step() twice in a step"
    loop 2 120 --trap late-optimizer --epochs 1 -- "${lcommon[@]}"
    expect_error 2 "that Sinew does not know steps the model's parameters" "an optimizer made in the loop"
    # job.wrap(net, optimizer=opt) is Job.run's: in the own loop it is refused at start, unsharded and sharded alike
    # (sharded it trained, unsharded its step() said it was inside a Job.run step).
    for stage in none optimizer; do
      loop 2 120 --trap wrap-optimizer --epochs 1 -- "${lcommon[@]}" --shard $stage
      expect_error 2 "drop optimizer= from job.wrap()" "job.wrap(optimizer=) in the own loop, --shard $stage"
    done
    loop 2 120 --trap batch-sampler --epochs 1 -- "${lcommon[@]}"
    expect_error 2 "give it to the DataLoader as sampler=" "job.sampler() as batch_sampler="
    loop 2 120 --trap break -- "${lcommon[@]}"
    expect_error 2 "the loop left the DataLoader before the end of the epoch" "break out of the DataLoader"
    loop 2 120 --epochs 1 --lr 0.1 -- "${lcommon[@]}" --lr 0.3
    expect_error 2 "in the script's own loop the learning rate is the optimizer's" "Sinew's --lr in the own loop"
    # The script's own --lr, --epochs, --batch-size and --seed are its own (nothing of Sinew's reads argv).
    loop 2 120 --epochs 1 --batch-size 8 --lr 0.2 --seed 3 -- "${lcommon[@]}" || fail "the script's options: exit $?"
    grep -q "epoch 1: .* lr 0.2 world 2 step 64" "$d/out.txt" || fail "the script's --lr/--batch-size were not its own"
    echo "ok: the script's --lr 0.2 --batch-size 8 --epochs 1 are its own (64 steps of 2 x 8)"
    # Frozen parameters and integer buffers made rank 0's at start and given to a replacement.
    loop 3 180 --trap frozen --epochs 1 -- "${lcommon[@]}" --inject-fault 2:backward:5 || fail "frozen: exit $?"
    [ "$(grep -o "equal on every rank: True" "$d/out.txt" | wc -l)" -eq 3 ] || fail "frozen tensors differ between ranks"
    grep -q "frozen bias sum 4 num_batches_tracked" "$d/out.txt" || fail "not rank 0's frozen bias"
    echo "ok: a frozen parameter and an integer buffer are rank 0's everywhere, the replacement's too"
    # Updates by hand, no optimizer; and clip_grad_norm_ between backward() and step().
    loop 2 120 --trap no-optimizer --epochs 1 -- "${lcommon[@]}" --audit-dir "$d/audit" || fail "by hand: exit $?"
    loop 2 120 --trap clip --epochs 1 -- "${lcommon[@]}" || fail "clip: exit $?"
    echo "ok: updates by hand and clip_grad_norm_ train"
    # A script that indexes its own data in its own order: job.sampler(n, shuffle=False).batches(), a kill.
    rm -rf "$d/audit"
    loop 3 180 --trap own-order -- "${lcommon[@]}" --batch-size 16 --audit-dir "$d/audit" \
      --inject-fault 1:backward:7 || fail "own order: exit $?"
    grep -q "first indices \[0, 1, 2, 3\]" "$d/out.txt" || fail "own order: the data set's order was not kept"
    audit >/dev/null || fail "own order: audit"
    echo "ok: the script's own indexing in the data set's order, a kill, the audit exact"
    # Random number generators registered (sinew.RandomState): rank 0's everywhere, a replacement's too (2 ranks:
    # equal batches in every step, so that dropout draws as many numbers on each).
    loop 2 180 --trap rng --epochs 1 -- "${lcommon[@]}" --inject-fault 1:backward:6 || fail "rng: exit $?"
    [ "$(grep -o "equal on every rank: True" "$d/out.txt" | wc -l)" -eq 2 ] || fail "the generators differ"
    echo "ok: registered random number generators are equal on every rank after a kill"
    ;;
  *)
    echo "unknown scenario $scenario"
    exit 2
    ;;
esac
echo "PASS $scenario"
