#!/usr/bin/env bash
# The kill of the demonstrations (train-fashion-mnist.sh, train-torch-resnet.sh): waits until the job's
# metrics show step STEP (or the job JOB_PID has ended, or 20 minutes passed), then kill -9 the process
# that was started as rank 2 and whose command line contains MARK.
#
# usage: kill-at-step.sh METRICS STEP MARK JOB_PID
set -u
metrics=$1 at=$2 mark=$3 job=$4
step=
for _ in $(seq 4800); do
  step=$(grep -o '"step":[0-9]*' "$metrics" 2>/dev/null | tail -n 1 | cut -d: -f2 || true)
  [ "${step:-0}" -ge "$at" ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.25
done
# The environment of a process that may end while it is read (this script's own command substitutions
# match MARK too, and are gone a moment later): nothing when it is gone, never an error line.
environ_of() {
  local e
  e=$(cat "/proc/$1/environ" 2>/dev/null | tr '\0' '\n' 2>/dev/null) || true
  printf '%s\n' "$e"
}
for p in $(pgrep -f -- "$mark" 2>/dev/null || true); do
  [ "$p" != $$ ] || continue
  if environ_of "$p" | grep -qx "OMPI_COMM_WORLD_RANK=2"; then
    # Gone between the look and the kill: nothing to say.
    kill -9 "$p" 2>/dev/null && echo "[sinew] kill -9 $p (rank 2) at step ${step:-?}"
  fi
done
