#!/usr/bin/env bash
# Runs a command next to a private etcd: starts one with hpc/etcd/etcd.sh in a fresh folder under /tmp,
# exports SINEW_ETCD (its endpoint) and SINEW_ETCD_DIR (its folder, for tests that restart it), runs the
# command, always stops etcd and removes the folder, and exits with the command's exit code.
#
# Usage: with_etcd.sh COMMAND [ARG...]
# Exit code 77 (ctest: skipped) when etcd is not installed.
set -euo pipefail

[[ $# -gt 0 ]] || { echo "usage: with_etcd.sh COMMAND [ARG...]" >&2; exit 2; }
command -v etcd >/dev/null || { echo "with_etcd: etcd not installed (apt-get install etcd-server): skipped" >&2; exit 77; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
etcd_sh=$here/../../hpc/etcd/etcd.sh

dir=$(mktemp -d /tmp/sinew-etcd-test.XXXXXX)
child=
# shellcheck disable=SC2317 # invoked by the trap
cleanup() {
  local rc=$?
  if [[ -n $child ]]; then kill -TERM "$child" 2>/dev/null || true; fi
  bash "$etcd_sh" down --dir "$dir" || true
  rm -rf "$dir"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

rc=0
endpoint=$(bash "$etcd_sh" up --dir "$dir") || rc=$?
((rc == 0)) || exit "$rc" # etcd.sh said why (77: not installed)
export SINEW_ETCD=$endpoint SINEW_ETCD_DIR=$dir
echo "with_etcd: etcd at $SINEW_ETCD ($dir)" >&2

# In the background, so that a TERM (ctest's timeout) reaches the trap at once, not after the command.
"$@" &
child=$!
rc=0
wait "$child" || rc=$?
child=
exit "$rc"
