#!/usr/bin/env bash
# Configures and builds Sinew against the ULFM Open MPI from setup.sh (or Debian's MPI when it is absent).
# Extra arguments go to cmake's configure step, e.g. -DSINEW_SANITIZE=address,undefined.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cmake_args=(-S "$sinew_root" -B "$SINEW_BUILD_DIR" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}")
if [ -x "$SINEW_MPI_PREFIX/bin/mpicc" ] && [ "${SINEW_SKIP_ULFM:-0}" != 1 ]; then
  cmake_args+=(-DMPI_HOME="$SINEW_MPI_PREFIX" -DMPI_C_COMPILER="$SINEW_MPI_PREFIX/bin/mpicc"
               -DMPIEXEC_EXECUTABLE="$SINEW_MPI_PREFIX/bin/mpirun")
else
  echo "[sinew-build] no ULFM Open MPI in $SINEW_MPI_PREFIX: building against the system MPI (no in-place recovery)"
fi
echo "[sinew-build] configuring in $SINEW_BUILD_DIR"
mkdir -p "$SINEW_BUILD_DIR"
cmake "${cmake_args[@]}" "$@" >"$SINEW_BUILD_DIR/configure.log" 2>&1 || {
  cat "$SINEW_BUILD_DIR/configure.log" >&2
  exit 1
}
grep -E "^-- Sinew:" "$SINEW_BUILD_DIR/configure.log" | sed 's/^-- /[sinew-build] /'
echo "[sinew-build] compiling with $(nproc) jobs"
# SINEW_BUILD_TARGETS: only these targets (e.g. "sinew-train" for the restart-mode tree of test.sh).
targets=()
for t in ${SINEW_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$SINEW_BUILD_DIR" -j "$(nproc)" "${targets[@]}"
