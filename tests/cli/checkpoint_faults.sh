#!/usr/bin/env bash
# Checkpoints that survive failures, as scenarios with real processes:
#  - a rank SIGKILLed at each named phase of the checkpoint writer: the job fails, the previous
#    checkpoint stays valid, nothing of the interrupted one counts as committed, and a new job
#    (at another world size) resumes from the previous one;
#  - a full disk (a small tmpfs, root only): a clear error, training goes on, the previous checkpoint
#    stays intact, exit code 4.
# Usage: checkpoint_faults.sh SINEW_TRAIN SINEW_CKPT MPIEXEC [MPIEXEC_FLAGS...]
set -u
train=$1
ckpt=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
cleanup() {
  mountpoint -q "$work/full" 2>/dev/null && umount "$work/full"
  rm -rf "$work"
}
trap cleanup EXIT
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     | /' <<<"$2" | tail -n 15; }

# --elastic off: these scenarios are about the checkpoint when the job dies (in-place recovery is tested
# in elastic_scenarios.sh).
common=(--dataset synthetic --batch-size 16 --checkpoint-every 5 --progress false --timeout-ms 10000 --elastic off)

for spec in 1:before-shard-data 1:after-shard-data 2:before-fsync 0:before-manifest 0:before-commit; do
  rank=${spec%%:*}
  phase=${spec#*:}
  d="$work/$phase"
  out=$(timeout 120 "${mpiexec[@]}" -n 3 "$train" "${common[@]}" --epochs 1 --model mlp:32 --max-steps 20 --checkpoint-dir "$d" \
        --inject-fault "$rank:$phase:10" --log-level warn 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then bad "$phase: job should fail when rank $rank dies (exit $rc)" "$out"; continue; fi
  if ! grep -q "injected fault: killing launch rank $rank at phase $phase of step 10" <<<"$out"; then bad "$phase: the fault did not fire" "$out"; continue; fi
  v=$("$ckpt" verify "$d/ckpt-0000000005" 2>&1) || { bad "$phase: previous checkpoint no longer valid" "$v"; continue; }
  if [ -e "$d/ckpt-0000000010/COMMITTED" ]; then bad "$phase: interrupted checkpoint looks committed"; continue; fi
  listed=$("$ckpt" list "$d" 2>&1)
  if grep -q "ckpt-0000000010 " <<<"$listed" && ! grep -q "ckpt-0000000010 .*uncommitted (ignored)" <<<"$listed"; then
    bad "$phase: list shows the interrupted checkpoint as committed" "$listed"; continue
  fi
  out=$(timeout 120 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --epochs 1 --model mlp:32 --max-steps 20 --checkpoint-dir "$d" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "resumed from $d/ckpt-0000000005" <<<"$out"; then
    bad "$phase: resume from the previous checkpoint (exit $rc)" "$out"; continue
  fi
  ok "rank $rank killed at $phase: previous checkpoint valid, resumed at 2 ranks"
done

# SIGUSR1 to one rank: the group agrees to stop, checkpoints at the next step boundary, exits 75.
d="$work/signal"
timeout 120 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --model mlp:32 --epochs 1000 --checkpoint-dir "$d" \
  --checkpoint-async true --metrics "$work/signal.jsonl" >"$work/signal.log" 2>&1 &
job=$!
for _ in $(seq 1 200); do [ -d "$d/ckpt-0000000010" ] && break; sleep 0.1; done
pid=$(pgrep -f -- "--checkpoint-dir $d" | while read -r p; do
        [ "$(cat /proc/"$p"/comm 2>/dev/null)" = sinew-train ] && echo "$p"; done | tail -n 1)
if [ -n "$pid" ]; then kill -USR1 "$pid"; fi
wait $job
rc=$?
last=$("$ckpt" list "$d" 2>/dev/null | grep -o 'ckpt-[0-9]*' | head -n 1)
if [ -n "$pid" ] && [ $rc -eq 75 ] && grep -q '"stopped_by_signal":10' "$work/signal.jsonl" &&
   [ -n "$last" ] && "$ckpt" verify "$d/$last" >/dev/null 2>&1 &&
   grep -q "\"reason\":\"signal\"" "$work/signal.jsonl"; then
  ok "SIGUSR1 to one rank: checkpoint at the next step ($last), exit 75"
else
  bad "SIGUSR1 (pid '$pid', exit $rc, last '$last')" "$(cat "$work/signal.log")"
fi

# Full disk: the first checkpoint fits, the second does not.
if [ "$(id -u)" -eq 0 ] && mkdir -p "$work/full" && mount -t tmpfs -o size=3600k tmpfs "$work/full" 2>/dev/null; then
  out=$(timeout 120 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --epochs 1 --model mlp:512,512 --max-steps 12 --checkpoint-dir "$work/full" \
        --metrics "$work/full-metrics.jsonl" 2>&1)
  rc=$?
  if [ $rc -eq 4 ] && grep -q "checkpoint failed at step 10, training goes on" <<<"$out" &&
     grep -q '"event":"done"' "$work/full-metrics.jsonl" && "$ckpt" verify "$work/full/ckpt-0000000005" >/dev/null 2>&1 &&
     [ ! -e "$work/full/ckpt-0000000010.partial" ]; then
    ok "full disk: clear error, training went on to the end, previous checkpoint intact, exit 4"
  else
    bad "full disk (exit $rc)" "$out$(ls -la "$work/full" 2>&1)"
  fi
else
  skip full-disk "needs root to mount a small tmpfs"
fi

finish
