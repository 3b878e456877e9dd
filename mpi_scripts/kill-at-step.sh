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
for p in $(pgrep -f -- "$mark" || true); do
  # (A process that has just gone has no environ: the redirection's error is the group's, hidden with it.)
  if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2"; then
    echo "[sinew] kill -9 $p (rank 2) at step ${step:-?}"
    kill -9 "$p"
  fi
done
