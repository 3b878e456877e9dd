#!/usr/bin/env bash
# Installs the built Sinew into a temporary prefix, then configures, builds and runs a consumer project
# that uses find_package(Sinew). Usage: install_test.sh BUILD_DIR MPI_C_COMPILER
set -euo pipefail
build=$1
mpicc=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" -DMPI_C_COMPILER="$mpicc" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/consumer/c"
