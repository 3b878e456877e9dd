#!/usr/bin/env bash
# The README's test command: set-up (if needed), build, then the whole test suite under ctest.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
bash "$here/setup.sh"
bash "$here/build.sh"
. "$here/env.sh"
cd "$SINEW_BUILD_DIR"
# Multi-rank tests declare PROCESSORS 2, so -j2 on two cores runs one of them at a time.
ctest --output-on-failure -j "$(nproc)" "$@"
