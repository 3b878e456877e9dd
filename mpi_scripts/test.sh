#!/usr/bin/env bash
# The README's test command: set-up (if needed), build, then the whole test suite under ctest.
set -euo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
bash "$here/setup.sh"
bash "$here/build.sh"
. "$here/env.sh"
# Restart mode is tested under Debian's Open MPI 4.1 (no ULFM) too: sinew-train and, with Torch, the Python
# package built against it.
ompi4_targets=sinew-train
if ls "$SINEW_BUILD_DIR"/python/sinew/_core*.so >/dev/null 2>&1; then ompi4_targets="sinew-train sinew_python"; fi
SINEW_SKIP_ULFM=1 SINEW_BUILD_DIR="$SINEW_BUILD_DIR/ompi4" SINEW_BUILD_TARGETS="$ompi4_targets" bash "$here/build.sh"
cd "$SINEW_BUILD_DIR"
# Multi-rank tests declare PROCESSORS 2, so -j2 on two cores runs one of them at a time.
ctest --output-on-failure -j "$(nproc)" "$@"
