#!/usr/bin/env bash
# In-place fault tolerance and elasticity, as scenarios with real processes under Open MPI with ULFM.
# Each scenario runs a short Fashion-MNIST training at 4 ranks with ranks killed at named phases (or from
# outside), and asserts: exit 0, the expected events in the metrics, test accuracy within TOLERANCE points
# of the failure-free reference run, and the exactly-once audit of every sample used.
#
# Usage: elastic_scenarios.sh SCENARIO WORKDIR SINEW_TRAIN MPIEXEC [MPIEXEC_FLAGS...]
#   SCENARIO: reference (the failure-free run; writes WORKDIR/reference) or one of the names below.
set -u
scenario=$1
workdir=$2
train=$3
shift 3
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tolerance=3.0
n=4
limit=8192
epochs=2

# Every scenario trains on Fashion-MNIST: without it the scenario is skipped (exit 77, SKIP_RETURN_CODE in
# tests/cli/CMakeLists.txt), not passed.
. "$here/lib.sh"
need_fashion_mnist "$scenario"

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")  # one fresh directory per run of the scenario
trap "[ -n \"\${KEEP:-}\" ] || rm -rf \"\$d\"" EXIT

common=(--dataset fashion-mnist --limit-train $limit --limit-test 2000 --model mlp:64 --epochs $epochs
        --batch-size 32 --progress false --log-every 5
        --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --checkpoint-dir "$d/ckpt" --checkpoint-every 25)

# run DEADLINE_S [sinew-train options...]: the job, with a deadline so that a hang fails the scenario.
run() {
  local deadline=$1
  shift
  timeout -k 5 "$deadline" "${mpiexec[@]}" -n $n "$train" "${common[@]}" --lr "${lr:-0.05}" --timeout-ms 30000 "$@" \
    >"$d/out.txt" 2>&1
}

# check_exit_after_done S: the job (run() just returned) ended at most S seconds after its `done` event:
# a finished job must not hang in MPI_Finalize or on a process that never joined.
check_exit_after_done() {
  local limit=$1 ended
  ended=$(date +%s.%N)
  python3 - "$d/metrics.jsonl" "$ended" "$limit" <<'EOF'
import json, sys
done = [json.loads(l) for l in open(sys.argv[1]) if '"event":"done"' in l]
if not done:
    sys.exit("FAIL: no done event")
late = float(sys.argv[2]) - done[-1]["unix_time"]
print(f"job ended {late:.1f} s after its done event")
sys.exit(0 if late <= float(sys.argv[3]) else f"FAIL: the job ended {late:.1f} s after done (limit {sys.argv[3]} s)")
EOF
}

# check [check_run.py options...]: exit status, events, accuracy, audit.
check() {
  local rc=$1
  shift
  local ok=1
  if [ "$rc" -ne 0 ]; then echo "FAIL $scenario: exit $rc (expected 0)"; ok=0; fi
  if ! python3 "$here/check_run.py" "$d/metrics.jsonl" --reference "$workdir/reference" --tolerance $tolerance "$@"; then
    ok=0
  fi
  if ! python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $limit --epochs $epochs; then ok=0; fi
  if [ $ok -ne 1 ]; then
    echo "---- last lines of the job's output ----"
    tail -n 40 "$d/out.txt"
    exit 1
  fi
  echo "ok   $scenario"
}

# The pid of the process with launch rank R of this scenario's job (found through its environment).
pid_of_rank() {
  local r=$1 p
  for p in $(pgrep -f -- "--audit-dir $d/audit"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$r"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# The pid of a process of this job that MPI_Comm_spawn started (a world of its own, of size 1), if any.
pid_of_spawned() {
  local p
  for p in $(pgrep -f -- "--audit-dir $d/audit"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sinew-train ] || continue
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_SIZE=1"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# Waits until the metrics show step >= S (or gives up after 60 s).
wait_for_step() {
  local s=$1 i
  for i in $(seq 600); do
    if [ -f "$d/metrics.jsonl" ] && python3 - "$d/metrics.jsonl" "$s" <<'EOF'; then return 0; fi
import json, sys
steps = [json.loads(l).get("step", 0) for l in open(sys.argv[1]) if l.strip() and "loss" in l]
sys.exit(0 if steps and max(steps) >= int(sys.argv[2]) else 1)
EOF
    sleep 0.1
  done
  return 1
}

# Waits until the metrics hold an event NAME (or gives up after 60 s).
wait_for_event() {
  local i
  for i in $(seq 600); do
    grep -q "\"event\":\"$1\"" "$d/metrics.jsonl" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

case "$scenario" in
  reference)
    run 120 --grow false
    rc=$?
    [ $rc -eq 0 ] || { echo "FAIL reference run: exit $rc"; tail -n 40 "$d/out.txt"; exit 1; }
    python3 "$here/check_run.py" "$d/metrics.jsonl" --failures 0 --write-reference "$workdir/reference" || exit 1
    python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $limit --epochs $epochs || exit 1
    echo "ok   reference"
    ;;
  forward | backward | allreduce | optimizer)
    run 120 --grow false --inject-fault "2:$scenario:30"
    check $? --failures 1 --event shrink --event rescale --event recovered --final-world-size 3
    ;;
  checkpoint-write)
    run 120 --grow false --inject-fault "1:checkpoint-write:50"
    check $? --failures 1 --event recovered --final-world-size 3
    ;;
  rank0)
    run 120 --grow false --inject-fault "0:allreduce:40"
    check $? --failures 1 --event recovered --final-world-size 3
    ;;
  two-failures)
    run 120 --grow false --inject-fault "1:forward:20" --inject-fault "3:allreduce:70"
    check $? --failures 2 --event recovered:2 --final-world-size 2
    ;;
  during-recovery)
    run 120 --grow false --inject-fault "1:forward:20" --inject-fault "2:recovery:20"
    check $? --failures 1 --event recovered --final-world-size 2
    ;;
  grow)
    run 150 --inject-fault "3:backward:30"
    check $? --failures 1 --event grow --event recovered --final-world-size 4
    ;;
  during-spawn)
    # A member dying while the group spawns its replacement blocks MPI_Comm_spawn at the root for ever in
    # Open MPI 5.0.7 (in PMIx_Connect; revoke does not reach it). The spawn's own deadline gives it up,
    # the survivors agree, see the failure, shrink again and spawn two replacements; the process of the
    # abandoned spawn leaves by itself. In place: exit 0, no abort, back to 4, and the job exits promptly.
    run 150 --spawn-timeout-ms 5000 --inject-fault 3:backward:30 --inject-fault 1:spawn:30
    rc=$?
    grep -aq "did not return within 5000 ms" "$d/out.txt" || { echo "FAIL $scenario: the spawn deadline did not fire"; tail -n 30 "$d/out.txt"; exit 1; }
    if grep -aq "MPI_ABORT was invoked" "$d/out.txt"; then echo "FAIL $scenario: MPI_Abort was called"; exit 1; fi
    check_exit_after_done 10 || exit 1
    check $rc --failures 1 --event grow --event recovered --final-world-size 4
    ;;
  spawn-deadline)
    # A spawn that cannot complete within --spawn-timeout-ms with every member alive (50 ms: starting a
    # process and its MPI_Init alone take 0.1-0.6 s on these machines; 200 ms was once enough, until a
    # faster machine spawned within it) is given up: the group trains on at its size (a grow event with
    # the error), and the abandoned new process leaves without failing the job (mpirun exit 0): told so by
    # its parents once their spawn returns, or by itself at its join deadline (5 s).
    run 120 --spawn-timeout-ms 50 --inject-fault 3:backward:30
    rc=$?
    check_exit_after_done 10 || exit 1
    check $rc --failures 1 --field 'grow.error=could not start 1 new processes: the spawn did not complete within 50 ms' \
      --field grow.world_size=3 --final-world-size 3
    ;;
  two-grow-exit)
    # Two failures one after the other, each recovered and grown back to 4 (two generations of spawned
    # replacements): after the done line every process exits within seconds (bounded finalize).
    run 150 --spawn-timeout-ms 10000 --inject-fault 3:backward:30 --inject-fault 1:backward:60
    rc=$?
    check_exit_after_done 10 || exit 1
    check $rc --failures 2 --event grow:2 --final-world-size 4
    ;;
  global-batch)
    # --global-batch keeps 128 samples per step at every size: 3 ranks x 32 accumulate 2 micro-batches,
    # and the run takes exactly as many steps as the failure-free one (2 x 8192 / 128).
    run 120 --grow false --global-batch 128 --inject-fault 2:forward:30
    check $? --failures 1 --field rescale.accumulation=2 --field rescale.global_batch=128 --field done.steps=128
    ;;
  lr-scaling)
    # sqrt scaling: 4 -> 3 ranks scales the lr by sqrt(3/4) at once; growing back ramps it to 1 over 20 steps.
    run 150 --lr-scaling sqrt --rescale-ramp-steps 20 --inject-fault 3:optimizer:30
    check $? --failures 1 --event rescale:2 --field rescale.lr_factor_from=0.8660254037844386 \
      --field rescale.lr_factor_to=1 --field rescale.ramp_steps=20 --final-world-size 4
    ;;
  job-server)
    # The schedule shrinks the group (ranks leave, not a failure), grows it (spawn), shrinks it again.
    run 150 --resize-schedule 20:2,60:4,90:3 --lr-scaling linear
    check $? --failures 0 --event shrink:2 --event grow --field shrink.reason=leave --final-world-size 3
    ;;
  leave)
    # SIGUSR2 asks one rank to leave at the next step boundary: it exits 0, the others go on with 3.
    run 120 --grow false --step-sleep-ms 10 &
    job=$!
    wait_for_step 20 && p=$(pid_of_rank 3) && kill -USR2 "$p"
    wait $job
    check $? --failures 0 --event shrink --field shrink.why=requested --final-world-size 3
    ;;
  spare | spares-node | spare-rank0 | spare-during-recovery)
    # Hot spares (--spares): launched with the job, they wait; a failed rank is replaced by one of them
    # (promoted, no spawn), and the job exits within seconds of its done line, spares included.
    case "$scenario" in
      spare) n=5 run 120 --spares 1 --inject-fault 1:allreduce:30; rc=$?; k=1 ;;
      spares-node) n=6 run 120 --spares 2 --inject-fault 1:allreduce:30 --inject-fault 2:allreduce:30; rc=$?; k=2 ;;
      spare-rank0) n=5 run 120 --spares 1 --inject-fault 0:backward:30; rc=$?; k=1 ;;
      spare-during-recovery)
        n=6 run 120 --spares 2 --inject-fault 1:allreduce:30 --inject-fault 2:recovery:30; rc=$?; k=2 ;;
    esac
    check_exit_after_done 10 || rc=1
    check $rc --failures 1 --field failure.promoted=$k --field failure.lost=$k --field failure.spawn_ms=0 \
      --final-world-size 4
    ;;
  spare-then-spawn)
    # One spare, two failures: the first is replaced by the spare, the second by a spawned process.
    n=5 run 150 --spares 1 --inject-fault 1:allreduce:30 --inject-fault 2:allreduce:60
    rc=$?
    check_exit_after_done 10 || rc=1
    check $rc --failures 2 --field failure.promoted=0 --event grow --final-world-size 4
    grep -q "back to 4 (1 hot spare)" "$d/out.txt" || { echo "FAIL $scenario: the first failure did not use the spare"; exit 1; }
    ;;
  spare-killed)
    # An idle spare dies (kill -9 from outside); the next failure is replaced by the other spare.
    n=6 run 150 --spares 2 --step-sleep-ms 10 --inject-fault 1:allreduce:60 &
    job=$!
    wait_for_step 10 && p=$(pid_of_rank 5) && kill -9 "$p"
    wait $job
    rc=$?
    check_exit_after_done 10 || rc=1
    check $rc --failures 1 --field failure.promoted=1 --field failure.spawn_ms=0 --final-world-size 4
    ;;
  replacement-join)
    # The replacement is killed while it joins: rank 3 dies at step 30, the group spawns a replacement, and
    # that process is killed (kill -9) the moment it appears, in its start-up or its join. The group sees
    # one more failure (or gives up on the spawn at its deadline) and goes on in place: done, the audit
    # exact, one launch, and the job exits within seconds of its done line. Under sinew-run: mpirun itself
    # returns non-zero (PRRTE saw a process of the job killed), and the job has finished all the same.
    timeout -k 5 150 "$root/mpi_scripts/sinew-run" -n $n --events "$d/supervise.jsonl" -- "$train" \
      "${common[@]}" --timeout-ms 30000 --step-sleep-ms 10 --spawn-timeout-ms 10000 --inject-fault 3:backward:30 \
      >"$d/out.txt" 2>&1 &
    job=$!
    p=
    for _ in $(seq 1500); do p=$(pid_of_spawned) && break; sleep 0.02; done
    [ -n "$p" ] && kill -9 "$p"
    wait $job
    rc=$?
    [ -n "$p" ] || { echo "FAIL $scenario: no replacement was spawned"; tail -n 30 "$d/out.txt"; exit 1; }
    echo "killed the replacement (pid $p) as it joined"
    [ "$(grep -c '"event":"launch"' "$d/supervise.jsonl")" -eq 1 ] || { echo "FAIL $scenario: not in place (relaunched)"; exit 1; }
    check_exit_after_done 10 || rc=1
    check $rc --event grow
    ;;
  spare-join)
    # A hot spare killed as it is promoted: rank 1 dies at step 30, and the spare (launch rank 4) is killed
    # (kill -9) 20 ms later, while the pool promotes it and sends it the state. The group finds it dead too
    # and spawns instead: back to 4, in place.
    n=5 run 150 --spares 1 --step-sleep-ms 10 --spawn-timeout-ms 10000 --inject-fault 1:allreduce:30 &
    job=$!
    spare= victim=
    for _ in $(seq 600); do spare=$(pid_of_rank 4) && victim=$(pid_of_rank 1) && break; sleep 0.05; done
    if [ -n "$victim" ]; then
      while [ -d "/proc/$victim" ] && [ "$(cut -d' ' -f3 "/proc/$victim/stat" 2>/dev/null)" != Z ]; do sleep 0.002; done
      sleep 0.02  # rank 1 has died: the pool is promoting the spare
      kill -9 "$spare"
    fi
    wait $job
    rc=$?
    [ -n "$spare" ] || { echo "FAIL $scenario: no spare found"; exit 1; }
    check_exit_after_done 10 || rc=1
    check $rc --final-world-size 4
    ;;
  spawn-root)
    # The spawning root dies during the spawn: rank 3 dies at step 30, and launch rank 0, the view's rank 0
    # and so the root of MPI_Comm_spawn, dies as the spawn starts (fault point spawn). The spawn fails at the
    # others or passes its deadline; they agree, see the failure, shrink and spawn again with a new root.
    run 150 --spawn-timeout-ms 5000 --inject-fault 3:backward:30 --inject-fault 0:spawn:30
    rc=$?
    check_exit_after_done 10 || rc=1
    check $rc --event grow --final-world-size 4
    ;;
  killed-mpirun)
    # mpirun itself is killed (kill -9) at step 30, under sinew-run: every rank leaves at once (its launcher
    # is gone: no rank trains on unseen), and sinew-run relaunches at the same size from the state in node
    # memory, at the step where it stopped.
    timeout -k 5 200 "$root/mpi_scripts/sinew-run" -n $n --events "$d/supervise.jsonl" -- "$train" \
      "${common[@]}" --timeout-ms 30000 --step-sleep-ms 10 >"$d/out.txt" 2>&1 &
    job=$!
    wait_for_step 30 && pkill -9 -f -- "^[^ ]*(prterun|mpirun) .*--audit-dir $d/audit"
    wait $job
    rc=$?
    grep -q '"generation":1,"ranks":4' "$d/supervise.jsonl" || { echo "FAIL $scenario: no relaunch at 4 ranks"; tail -n 30 "$d/out.txt"; exit 1; }
    grep -q '"event":"resume".*\.bin"' "$d/metrics.jsonl" || { echo "FAIL $scenario: the relaunch did not resume from node memory"; tail -n 30 "$d/out.txt"; exit 1; }
    check $rc --event resume --final-world-size 4
    ;;
  spare-job-server)
    # The job server shrinks the group (members leave the pool) and grows it again from a spare.
    n=5 run 120 --spares 1 --resize-schedule 20:3,50:4
    rc=$?
    check_exit_after_done 10 || rc=1
    check $rc --failures 0 --event shrink --field grow.promoted=1 --field grow.spawn_ms=0 --final-world-size 4
    ;;
  min-ranks)
    # Below --min-ranks the job checkpoints and stops with exit code 75 (for a relaunch with more ranks).
    run 120 --grow false --min-ranks 4 --inject-fault 1:backward:30
    rc=$?
    if [ $rc -ne 75 ]; then echo "FAIL min-ranks: exit $rc (expected 75)"; tail -n 30 "$d/out.txt"; exit 1; fi
    python3 "$here/check_run.py" "$d/metrics.jsonl" --failures 1 --field checkpoint.reason=min-ranks \
      --field done.below_min_ranks=true || exit 1
    grep -q '"reason":"min-ranks"' "$d/metrics.jsonl" || { echo "FAIL min-ranks: no checkpoint before stopping"; exit 1; }
    grep -q "below --min-ranks 4" "$d/out.txt" || { echo "FAIL min-ranks: no message"; exit 1; }
    echo "ok   min-ranks"
    ;;
  algo-async-resize | algo-lpd-grow | algo-async-grow)
    # Membership changes rebuild an algorithm's state: async's background thread and communicator (ranks
    # leave, then spawned ones join; a failure, then a spawned replacement), the low-precision estimates of
    # the neighbours (a spawned replacement).
    if [ "$scenario" = algo-async-resize ]; then
      run 150 --algorithm async --resize-schedule 20:2,60:4
      check $? --failures 0 --event shrink --event grow --field done.algorithm=async --final-world-size 4
    else
      a=low_precision_decentralized
      [ "$scenario" = algo-async-grow ] && a=async
      run 150 --algorithm $a --inject-fault 3:allreduce:30
      check $? --failures 1 --event grow --field done.algorithm=$a --final-world-size 4
    fi
    ;;
  algo-reshard | algo-reshard-powersgd)
    # ByteGrad's per-rank error-feedback residuals (PowerSGD's error memories) go into checkpoints as one
    # block per rank, and a resume at another size spreads them over the new ranks
    # (docs/checkpoint-format.md).
    ef=(--algorithm bytegrad --error-feedback true --checkpoint-keep 0)
    tensor=algo/residual algorithm=bytegrad
    if [ "$scenario" = algo-reshard-powersgd ]; then
      ef=(--algorithm powersgd --checkpoint-keep 0)
      tensor=algo/powersgd_error algorithm=powersgd
    fi
    run 120 "${ef[@]}" --max-steps 50
    rc=$?
    [ $rc -eq 0 ] || { echo "FAIL $scenario: first run exit $rc"; tail -n 30 "$d/out.txt"; exit 1; }
    n=3 run 120 "${ef[@]}"
    rc=$?
    ckpt_tool="$(dirname "$train")/sinew-ckpt"
    params=$("$ckpt_tool" inspect "$d/ckpt/ckpt-0000000050" | awk '$1 == "params" {print $2}')
    r4=$("$ckpt_tool" inspect "$d/ckpt/ckpt-0000000050" | awk -v t=$tensor '$1 == t {print $2}')
    last=$(ls -d "$d"/ckpt/ckpt-* | tail -n 1)
    r3=$("$ckpt_tool" inspect "$last" | awk -v t=$tensor '$1 == t {print $2}')
    if [ "$r4" != $((4 * params)) ] || [ "$r3" != $((3 * params)) ]; then
      echo "FAIL $scenario: residual sizes $r4 (4 ranks) and $r3 (3 ranks) for $params parameters"; exit 1
    fi
    check $rc --field resume.from_world_size=4 --field resume.world_size=3 --field done.algorithm=$algorithm
    ;;
  algo-*)
    # Every communication algorithm converges and survives a rank killed in its exchange (for the
    # relaxed ones: the model exchange after the step; QAdam's compressed momenta and PowerSGD's factors,
    # both exchanged bucket by bucket during backward, past their warm-ups), at step 60.
    a=${scenario#algo-}
    extra=()
    case $a in
      ring) a=gradient_allreduce; extra=(--allreduce ring) ;;
      bytegrad) extra=(--error-feedback true) ;;
      bytegrad-4bit) a=bytegrad; extra=(--error-feedback true --bytegrad-bits 4) ;;
      qadam) extra=(--optimizer adam --qadam-warmup-steps 30); lr=0.002 ;;
      decentralized) extra=(--peer-selection shift_one) ;;
    esac
    run 150 --grow false --algorithm "$a" "${extra[@]}" --inject-fault 2:allreduce:60
    rc=$?
    if [ "$a" = auto ]; then
      check $rc --failures 1 --event recovered --event algorithm:2 --final-world-size 3
    else
      check $rc --failures 1 --event recovered --field done.algorithm="$a" --final-world-size 3
    fi
    ;;
  kill9 | kill9-async | kill9-decentralized)
    # kill -9 from outside at an arbitrary moment. The relaxed algorithms complete steps without a
    # collective over every rank, so the survivors stand at different steps: they resume from the least
    # advanced one, and the exactly-once audit holds (with the most advanced one it did not).
    algo=()
    [ "$scenario" = kill9-async ] && algo=(--algorithm async)
    [ "$scenario" = kill9-decentralized ] && algo=(--algorithm decentralized --peer-selection shift_one --comm-interval 3)
    run 120 --grow false --step-sleep-ms 15 "${algo[@]}" &
    job=$!
    wait_for_step 30 && sleep 0.$((RANDOM % 10)) && p=$(pid_of_rank 1) && kill -9 "$p"
    wait $job
    check $? --failures 1 --event recovered --final-world-size 3
    ;;
  sigstop | sigstop-spare)
    # A process that stops without dying (SIGSTOP), in the default configuration: Sinew's own detector
    # (--stall-timeout-ms, 10 s) fences it (SIGKILL) and the others recover in place, before the
    # collectives' deadline (30 s here, 300 s by default). With a hot spare, the spare takes its place.
    extra=(--grow false)
    [ "$scenario" = sigstop-spare ] && extra=(--spares 1) && n=5
    run 150 "${extra[@]}" --step-sleep-ms 15 &
    job=$!
    wait_for_step 30 && p=$(pid_of_rank 2) && stopped=$(date +%s.%N) && kill -STOP "$p"
    wait $job
    rc=$?
    python3 - "$d/metrics.jsonl" "$stopped" <<'EOF' || rc=1
import json, sys
f = [json.loads(l) for l in open(sys.argv[1]) if '"event":"failure"' in l]
if not f:
    sys.exit("FAIL: no failure event")
late = f[0]["detected_unix_time"] - float(sys.argv[2])
print(f"stopped rank excluded {late:.1f} s after SIGSTOP (stall timeout 10 s)")
sys.exit(0 if late <= 20 else "FAIL: exclusion took longer than 20 s")
EOF
    grep -q "fenced (SIGKILL)" "$d/out.txt" || { echo "FAIL $scenario: no fencing message"; rc=1; }
    if [ "$scenario" = sigstop-spare ]; then
      check $rc --failures 1 --field failure.promoted=1 --final-world-size 4
    else
      check $rc --failures 1 --event recovered --final-world-size 3
    fi
    ;;
  restart | restart-debian)
    # Restart mode: the supervisor relaunches on the surviving slots from the latest checkpoint. Under
    # Debian's Open MPI 4.1 (no ULFM) with a sinew-train built against it, or under Open MPI 5.
    if [ "$scenario" = restart-debian ]; then
      export SINEW_SKIP_ULFM=1
      if [ ! -x "$train" ]; then echo "FAIL restart-debian: $train is missing (mpi_scripts/test.sh builds it)"; exit 1; fi
    fi
    timeout -k 5 200 "$root/mpi_scripts/sinew-supervise" -n $n --events "$d/supervise.jsonl" -- "$train" \
      "${common[@]}" --timeout-ms 30000 --elastic restart --inject-fault 2:allreduce:40 >"$d/out.txt" 2>&1
    rc=$?
    grep -q '"generation":1' "$d/supervise.jsonl" || { echo "FAIL $scenario: no relaunch happened"; tail -n 30 "$d/out.txt"; exit 1; }
    check $rc --event resume --final-world-size 3
    ;;
  repair-deadline)
    # A repair call that never returns (Open MPI 5.0.7's shrink can hang in the ERA agreement): rank 1 dies,
    # and rank 2 stops, alive, at the start of the recovery, so that the others wait for it in their shrink
    # for ever. Every process's repair deadline (3 s to notice a silent member + 5 s + 10 ms per process) ends
    # it: the three exit with code 75, and the supervisor relaunches the job on the 3 slots left. The relaunch
    # loads the checkpoint of step 25, then the newer state the node kept in memory (--state-mirror, which
    # the supervisor passes): it goes on after step 29, the last one completed. The job ends done, with the
    # audit exact, well before the scenario's deadline.
    timeout -k 5 200 "$root/mpi_scripts/sinew-supervise" -n $n --events "$d/supervise.jsonl" -- "$train" \
      "${common[@]}" --timeout-ms 30000 --stall-timeout-ms 3000 --inject-fault 1:forward:30 \
      --inject-fault 2:recovery-hang:30 >"$d/out.txt" 2>&1
    rc=$?
    n_left=$(grep -ac "did not return within 8.0 s: stuck inside the MPI library" "$d/out.txt")
    [ "$n_left" -eq 3 ] || { echo "FAIL $scenario: $n_left processes passed their repair deadline (expected 3)"; tail -n 30 "$d/out.txt"; exit 1; }
    grep -q '"generation":1' "$d/supervise.jsonl" || { echo "FAIL $scenario: no relaunch happened"; tail -n 30 "$d/out.txt"; exit 1; }
    python3 - "$d/metrics.jsonl" <<'EOF' || { tail -n 30 "$d/out.txt"; exit 1; }
import json, sys
resumes = [e for e in map(json.loads, open(sys.argv[1])) if e.get("event") == "resume"]
memory = [e for e in resumes if e["path"].endswith(".bin")]
if not memory or memory[-1]["step"] != 29:
    sys.exit(f"FAIL repair-deadline: no resume from the node's memory at step 29: {resumes}")
print(f"resumed from {memory[-1]['path']} at step 29 (the checkpoint: step {resumes[0]['step']})")
EOF
    check $rc --event resume --final-world-size 3
    ;;
  *)
    echo "unknown scenario '$scenario'" >&2
    exit 2
    ;;
esac
