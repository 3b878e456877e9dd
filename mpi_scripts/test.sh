#!/usr/bin/env bash
# The README's test command: set-up (if needed), build, then the whole test suite under ctest.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
bash "$here/setup.sh"
bash "$here/build.sh"
. "$here/env.sh"
# Restart mode is tested under Debian's Open MPI 4.1 (no ULFM) too: sinew-train built against it.
SINEW_SKIP_ULFM=1 SINEW_BUILD_DIR="$SINEW_BUILD_DIR/ompi4" SINEW_BUILD_TARGETS=sinew-train bash "$here/build.sh"
cd "$SINEW_BUILD_DIR"
# Multi-rank tests declare PROCESSORS 2, so -j2 on two cores runs one of them at a time.
ctest --output-on-failure -j "$(nproc)" "$@"
