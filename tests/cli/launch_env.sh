#!/usr/bin/env bash
# The launch environment, with real processes under mpirun (core/launch.hpp, train/control.hpp):
#
#   early-signals  a stop signal that arrives while the job starts is not lost: SIGUSR1 to rank 0 while it
#                  is still reading its --config (from stdin, held open by the test: before MPI_Init),
#                  SIGUSR1 to the ranks, SIGUSR1 to mpirun (which forwards it), SIGTERM to one rank, the
#                  last three as soon as MPI_Init has begun on every rank (then the data loads for seconds).
#                  Each job checkpoints at its first agreement (step 10) and exits 75; a new job resumes.
#   requeue        a requeued Slurm job, as Slurm starts it (SLURM_JOB_ID, SLURM_RESTART_COUNT given to
#                  the ranks by mpirun -x; no Slurm daemons): %j in --checkpoint-dir, --metrics and
#                  --audit-dir; the first launch is stopped by an early SIGUSR1 (exit 75), the requeued
#                  one (SLURM_RESTART_COUNT=1) resumes, appends to the metrics, does not fire the injected
#                  fault again, and the audit holds across both (generations 0 and 1000). Plus the usage
#                  errors: %j outside Slurm, an unknown pattern, a malformed SINEW_RESTART_GENERATION.
#
# Usage: launch_env.sh CASE SINEW_TRAIN SINEW_CKPT MPIEXEC [MPIEXEC_FLAGS...]
set -u
case_name=$1
train=$2
ckpt=$3
shift 3
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
cleanup() {
  local j
  for j in $(jobs -p); do kill "$j" 2>/dev/null; done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
. "$here/lib.sh"
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     | /' <<<"$2" | tail -n 25; }

# These runs must not see a Slurm job of whoever runs the tests: the cases set the variables themselves.
unset SLURM_JOB_ID SLURM_JOBID SLURM_RESTART_COUNT SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID SINEW_RESTART_GENERATION

# Fashion-MNIST, all 70000 samples: loading it takes seconds, the window in which the signals land.
need_fashion_mnist "$case_name"
common=(--dataset fashion-mnist --model mlp:32 --batch-size 32 --progress false --log-every 5 --timeout-ms 30000)

# The pids of the ranks of the job whose command line holds MARK (its --metrics path).
ranks_of() {
  local p
  for p in $(pgrep -f -- "$1"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = sinew-train ] && echo "$p"
  done
}

# Whether process P catches signal S (its bit in /proc/P/status SigCgt).
catches() {
  local mask
  mask=$(awk '/^SigCgt:/ {print $2}' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$mask" ] && (((0x$mask >> ($2 - 1)) & 1))
}

# has_handlers PID: whether P catches SIGUSR1, SIGUSR2 and SIGTERM (sinew-train installs the handlers first
# thing in main(), before MPI_Init).
has_handlers() { catches "$1" 10 && catches "$1" 12 && catches "$1" 15; }

# poll CMD...: runs CMD every 10 ms until it succeeds (0) or 60 s have passed (1).
poll() {
  local _
  for _ in $(seq 6000); do
    "$@" && return 0
    sleep 0.01
  done
  return 1
}

# ranks_up MARK N: whether N ranks of the job run (sinew-train, not the program loader); prints their pids.
ranks_up() {
  local pids
  pids=$(ranks_of "$1")
  [ "$(wc -w <<<"$pids")" -eq "$2" ] && echo $pids
}

# rank_pid R PIDS...: the one of PIDS with launch rank R.
rank_pid() {
  local r=$1 p
  shift
  for p in "$@"; do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$r"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# phase PID: where the process is in its start-up, as far as its handlers tell: Open MPI installs its own
# SIGSEGV handler in MPI_Init.
phase() { if catches "$1" 11; then echo "after MPI_Init began"; else echo "before MPI_Init"; fi; }

# mpi_begun PIDS...: whether every one of PIDS is past the start of MPI_Init.
mpi_begun() {
  local p
  for p in "$@"; do [ "$(phase "$p")" = "after MPI_Init began" ] || return 1; done
}

# check_stopped NAME RC METRICS SIGNAL STARTED: exit 75, a signal checkpoint at the first agreement (step
# 10), the done event names the signal, and the metrics had no start event when the signal was sent.
check_stopped() {
  local name=$1 rc=$2 metrics=$3 sig=$4 started=$5 out=$6
  if [ "$started" != 0 ]; then bad "$name: training had started when the signal was sent" "$(cat "$out")"; return 1; fi
  if [ "$rc" -ne 75 ]; then bad "$name: exit $rc, expected 75" "$(cat "$out")"; return 1; fi
  if ! python3 - "$metrics" "$sig" <<'EOF'; then bad "$name: metrics" "$(cat "$out")"; return 1; fi
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ck = [e for e in ev if e.get("event") == "checkpoint" and e.get("reason") == "signal"]
done = [e for e in ev if e.get("event") == "done"]
if not ck or ck[0]["step"] != 10 or ck[0].get("error"):
    sys.exit(f"no signal checkpoint at step 10: {ck}")
if not done or done[-1].get("stopped_by_signal") != int(sys.argv[2]):
    sys.exit(f"done event does not name signal {sys.argv[2]}: {done}")
EOF
  return 0
}

# started METRICS: 1 if the job's metrics hold a start event (training set up), else 0.
started() { if grep -q '"event":"start"' "$1" 2>/dev/null; then echo 1; else echo 0; fi; }

case "$case_name" in
  early-signals)
    # How: SIGUSR1 to rank 0 before MPI_Init, to every rank, to mpirun; SIGTERM to rank 1 only (the
    # agreement spreads a signal that reached some ranks).
    for how in usr1-before-mpi-init usr1-ranks usr1-mpirun term-one-rank; do
      d="$work/$how"
      mkdir -p "$d"
      # mpirun forwards its stdin to rank 0 only: rank 0 reads its --config until the test writes it and
      # closes the pipe (after the signal), the other rank reads an empty one and waits in MPI_Init.
      (
        for _ in $(seq 2400); do [ -e "$d/go" ] && break; sleep 0.05; done
        echo "log-level = info"
      ) | timeout -k 5 120 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --epochs 1 --max-steps 40 \
        --checkpoint-dir "$d/ckpt" --metrics "$d/metrics.jsonl" --config /dev/stdin >"$d/out.txt" 2>&1 &
      job=$!
      pids=$(poll ranks_up "$d/metrics.jsonl" 2) && rank0=$(rank_pid 0 $pids) || rank0=
      ready=0
      if [ -z "$rank0" ]; then
        bad "$how: the job's two ranks did not start" "$(cat "$d/out.txt")"
      elif [ "$how" = usr1-before-mpi-init ]; then
        # Rank 0 waits for its --config: the handlers must be in place all the same.
        if poll has_handlers "$rank0"; then ready=1; else bad "$how: rank 0 never caught the signals"; fi
      else
        # The others land once MPI_Init has begun on every rank, while the data loads for seconds: the
        # handlers were installed before MPI_Init, and Open MPI must have left them alone.
        touch "$d/go"
        if ! poll mpi_begun $pids; then
          bad "$how: the ranks never began MPI_Init" "$(cat "$d/out.txt")"
        elif ! has_handlers "${pids%% *}" || ! has_handlers "${pids##* }"; then
          bad "$how: the ranks had no handlers for SIGUSR1/SIGUSR2/SIGTERM in MPI_Init"
        else
          ready=1
        fi
      fi
      if [ $ready -eq 0 ]; then
        touch "$d/go"
        kill "$job" 2>/dev/null
        wait "$job"
        continue
      fi
      read -r -a rank_pids <<<"$pids"
      at=$(phase "$rank0")
      case $how in
        usr1-before-mpi-init) kill -USR1 "$rank0"; sig=10 ;;
        usr1-ranks) kill -USR1 "${rank_pids[@]}"; sig=10 ;;
        usr1-mpirun) kill -USR1 "$(pgrep -P "$job")"; sig=10 ;;
        term-one-rank) kill -TERM "$(rank_pid 1 $pids)"; sig=15 ;;
      esac
      was_started=$(started "$d/metrics.jsonl")
      touch "$d/go"
      if [ "$how" = usr1-before-mpi-init ] && [ "$at" != "before MPI_Init" ]; then
        bad "$how: rank 0 had started MPI although it was still reading its --config"
      fi
      wait "$job"
      rc=$?
      if check_stopped "$how" $rc "$d/metrics.jsonl" $sig "$was_started" "$d/out.txt"; then
        if "$ckpt" verify "$d/ckpt/ckpt-0000000010" >/dev/null 2>&1; then
          ok "$how (sent $at): checkpoint at step 10, exit 75"
        else
          bad "$how: ckpt-0000000010 is not a valid checkpoint" "$("$ckpt" list "$d/ckpt" 2>&1)"
        fi
      fi
    done
    # The stopped job resumes from its signal checkpoint and finishes.
    d="$work/usr1-ranks"
    out=$(timeout -k 5 120 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --epochs 1 --max-steps 40 \
          --checkpoint-dir "$d/ckpt" --metrics "$d/resumed.jsonl" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && grep -q "resumed from $d/ckpt/ckpt-0000000010" <<<"$out" &&
       grep -q '"event":"done"' "$d/resumed.jsonl"; then
      ok "resumed from the signal checkpoint, exit 0"
    else
      bad "resume after the early signal (exit $rc)" "$out"
    fi
    ;;

  requeue)
    # Usage errors, before MPI starts: exit 2 and a message naming the option and the variable.
    expect job-id-outside-slurm 2 "--checkpoint-dir '$work/c-%j': %j is the Slurm job id, but SLURM_JOB_ID is not set" \
      -- "$train" --dataset synthetic --checkpoint-dir "$work/c-%j"
    expect unknown-pattern 2 "--metrics 'm-%x.jsonl': unknown pattern '%x'" -- "$train" --dataset synthetic --metrics 'm-%x.jsonl'
    expect lone-percent 2 "--audit-dir 'a%': ends in a lone '%'" -- "$train" --dataset synthetic --audit-dir 'a%'
    expect bad-generation 2 "SINEW_RESTART_GENERATION='1000' is not a whole number in \\[0, 999\\]" \
      -- env SINEW_RESTART_GENERATION=1000 "$train" --dataset synthetic --max-steps 1
    expect bad-restart-count 2 "SLURM_RESTART_COUNT='x' is not a whole number" \
      -- env SLURM_RESTART_COUNT=x "$train" --dataset synthetic --max-steps 1

    # One job, two launches: the first stopped early by SIGUSR1 (a preemption), the second requeued.
    limit=4096
    job_id=4242
    d="$work/requeue"
    mkdir -p "$d"
    opts=("${common[@]}" --limit-train "$limit" --epochs 2 --checkpoint-dir "$d/ckpt-%j" --metrics "$d/metrics-%j.jsonl"
          --audit-dir "$d/audit-%j" --inject-fault 1:forward:30)
    timeout -k 5 120 "${mpiexec[@]}" -x SLURM_JOB_ID=$job_id -n 2 "$train" "${opts[@]}" >"$d/out1.txt" 2>&1 &
    job=$!
    # As a preemption's signal forwarded by the batch script, while the job starts.
    if pids=$(poll ranks_up "$d/metrics-%j.jsonl" 2) && poll mpi_begun $pids; then
      kill -USR1 $pids
      was_started=$(started "$d/metrics-$job_id.jsonl")
      wait "$job"
      rc=$?
      if check_stopped "first launch" $rc "$d/metrics-$job_id.jsonl" 10 "$was_started" "$d/out1.txt"; then
        if [ -d "$d/ckpt-$job_id/ckpt-0000000010" ] && grep -q "launch: open-mpi rank 0 of 2, Slurm job $job_id" "$d/out1.txt"; then
          ok "first launch: %j expanded, stopped by SIGUSR1 at step 10, exit 75"
        else
          bad "first launch: no $d/ckpt-$job_id/ckpt-0000000010 or launch line" "$(ls -R "$d" | head; cat "$d/out1.txt")"
        fi
      fi
    else
      bad "first launch: the ranks never began MPI_Init" "$(cat "$d/out1.txt")"
      kill "$job" 2>/dev/null
      wait "$job"
    fi
    lines_before=$(wc -l <"$d/metrics-$job_id.jsonl" 2>/dev/null || echo 0)
    out=$(timeout -k 5 180 "${mpiexec[@]}" -x SLURM_JOB_ID=$job_id -x SLURM_RESTART_COUNT=1 -n 2 "$train" "${opts[@]}" 2>&1)
    rc=$?
    m="$d/metrics-$job_id.jsonl"
    if [ $rc -eq 0 ] && grep -q "resumed from $d/ckpt-$job_id/ckpt-0000000010" <<<"$out" &&
       ! grep -q "injected fault" <<<"$out" && grep -q "Slurm job $job_id, restart 1" <<<"$out" &&
       python3 - "$m" "$lines_before" <<'EOF'; then
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
before = int(sys.argv[2])
if before < 2 or len(ev) <= before:
    sys.exit(f"metrics not appended: {before} lines before, {len(ev)} after")
if not any(e.get("event") == "checkpoint" and e.get("reason") == "signal" for e in ev[:before]):
    sys.exit("the first launch's lines are gone")
res = [e for e in ev[before:] if e.get("event") == "resume"]
if not res or res[0].get("generation") != 1000:
    sys.exit(f"resume event without generation 1000: {res}")
if not any(e.get("event") == "done" and e.get("stopped_by_signal") == 0 for e in ev[before:]):
    sys.exit("no done event of the requeued launch")
EOF
      ok "requeued launch (SLURM_RESTART_COUNT=1): resumed, metrics appended, generation 1000, no injected fault"
    else
      bad "requeued launch (exit $rc)" "$out"
    fi
    gens=$(cat "$d/audit-$job_id"/audit-*.txt 2>/dev/null | awk '{print $1}' | sort -un | tr '\n' ' ')
    if [ "$gens" = "0 1000 " ] &&
       a=$(python3 "$root/mpi_scripts/check-audit.py" "$d/audit-$job_id" --dataset-size $limit --epochs 2 2>&1); then
      ok "audit across the requeue: generations $gens, every sample exactly once"
    else
      bad "audit across the requeue (generations '$gens')" "${a:-}"
    fi
    ;;
  *)
    echo "launch_env.sh: unknown case '$case_name' (early-signals | requeue)" >&2
    exit 2
    ;;
esac
finish
