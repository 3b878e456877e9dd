#!/usr/bin/env bash
# torch.device-kill: a member killed with sharded state on the device path (device_test.cpp's
# TorchDeviceFailure), at 3 ranks, with --shard gradients and optimizer. For each, the host path's run with
# the same fault first, which writes rank 0's final parameters to REFERENCE, then the device path's, which
# compares with them. Under ULFM mpirun exits 0 when every process that was not killed did.
#   device_kill.sh REFERENCE PROGRAM MPIEXEC [FLAGS...]
set -uo pipefail
ref=$1 prog=$2
shift 2
for stage in gradients optimizer; do
  rm -f "$ref"
  for mode in host device; do
    echo "== --shard $stage, the $mode path"
    SINEW_DEVICE_KILL=$mode SINEW_DEVICE_KILL_REFERENCE=$ref SINEW_DEVICE_KILL_STAGE=$stage \
      "$@" -x SINEW_DEVICE_KILL -x SINEW_DEVICE_KILL_REFERENCE -x SINEW_DEVICE_KILL_STAGE -n 3 "$prog" \
      --gtest_filter='TorchDeviceFailure.*'
    rc=$?
    if [ "$rc" -ne 0 ]; then
      # 77 (a skip) means the variables did not reach the ranks: a failure here, never a pass or a skip.
      echo "device_kill.sh: the $mode run of --shard $stage exited $rc"
      exit 1
    fi
  done
done
