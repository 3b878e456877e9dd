#!/usr/bin/env bash
# Installs the built Sinew into a temporary prefix (`cmake --install --prefix`, as a user would) and uses it
# from outside the build tree, one way per MODE:
#   find_package  configures, builds and runs tests/install/consumer with find_package(Sinew); the exported
#                 CMake files carry no CPU tuning flags, and the installed sinew-train loads the MPI it was
#                 linked with (its run path), not the system's libmpi of the same name
#   pkg_config    builds and runs the same consumer with `pkg-config --cflags --libs sinew` alone; sinew.pc
#                 carries no CPU tuning flags
#   modulefile    in a clean shell with Debian's Lmod: module use, module load sinew, sinew-train --version,
#                 the MPI's mpirun on PATH, the consumer found by CMake with nothing else set; module unload
#                 takes it all away again. Exit 77 (skipped) when Lmod is not installed.
# The consumer is built without any CPU tuning, so it also checks that code compiled with other flags than
# libsinew's frees the library's Eigen buffers correctly (EIGEN_MAX_ALIGN_BYTES, see cmake/SinewPackaging.cmake).
# Usage: install_test.sh MODE BUILD_DIR MPI_C_COMPILER
set -euo pipefail
mode=$1
build=$2
mpicc=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

fail() {
  echo "FAIL ($mode): $*" >&2
  exit 1
}
# run LOG COMMAND...: runs quietly, shows the log when the command fails.
run() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { cat "$log"; fail "$* (exit $?)"; }
}

# The MPI Sinew was built with; a system one (/usr) is where the loader looks anyway.
mpi_prefix=$(cd "$(dirname "$mpicc")/.." && pwd)
case $mpi_prefix in /usr | /) mpi_prefix= ;; esac

if [ "$mode" = modulefile ]; then
  lmod_init=${LMOD_PKG:-/usr/share/lmod/lmod}/init/bash
  if [ ! -r "$lmod_init" ]; then
    echo "SKIP: Lmod is not installed ($lmod_init missing; Debian package lmod)"
    exit 77
  fi
fi

run "$work/install.log" cmake --install "$build" --prefix "$prefix"
version=$(sed -n 's/^#define SINEW_VERSION "\(.*\)"$/\1/p' "$prefix/include/sinew/config.hpp")
[ -n "$version" ] || fail "no SINEW_VERSION in the installed sinew/config.hpp"
echo "installed Sinew $version into a temporary prefix"

# no_cpu_tuning WHAT FILE...: the files must not pass the build's CPU tuning on to consumers, and must pass
# on Eigen's alignment (part of the ABI).
no_cpu_tuning() {
  local what=$1
  shift
  if grep -n -E -e '-march|-mtune|-mcpu|-mavx|-msse' "$@"; then
    fail "$what pass CPU tuning flags of the Sinew build on to consumers (lines above)"
  fi
  grep -q -F 'EIGEN_MAX_ALIGN_BYTES=64' "$@" || fail "$what do not define EIGEN_MAX_ALIGN_BYTES=64 for consumers"
  echo "ok   $what: no CPU tuning flags, EIGEN_MAX_ALIGN_BYTES=64"
}

# runs_consumer BINARY: runs it and checks which libmpi it loads.
runs_consumer() {
  local out
  out=$("$1") || fail "the consumer $1 failed: $out"
  echo "$out"
  grep -q -F "sinew $version " <<<"$out" || fail "the consumer printed '$out', expected sinew $version"
  uses_our_mpi "$1"
}

# uses_our_mpi BINARY: the dynamic loader resolves libmpi to the MPI Sinew was built with.
uses_our_mpi() {
  [ -n "$mpi_prefix" ] || return 0
  local libmpi
  libmpi=$(ldd "$1" | awk '$1 ~ /^libmpi\.so/ {print $3}')
  case $libmpi in
    "$mpi_prefix"/*) echo "ok   $(basename "$1") loads $libmpi" ;;
    *) fail "$1 loads libmpi from '$libmpi', not from $mpi_prefix (the MPI Sinew was built with)" ;;
  esac
}

case $mode in
  find_package)
    no_cpu_tuning "the installed CMake package files" "$prefix"/lib*/cmake/Sinew/*.cmake
    run "$work/configure.log" cmake -S "$here/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
      -DMPI_C_COMPILER="$mpicc"
    run "$work/build.log" cmake --build "$work/consumer"
    runs_consumer "$work/consumer/c"
    if [ -x "$prefix/bin/sinew-train" ]; then
      uses_our_mpi "$prefix/bin/sinew-train"
    fi
    ;;

  pkg_config)
    command -v pkg-config >/dev/null || fail "pkg-config is not installed"
    pc=$(find "$prefix" -name sinew.pc)
    [ -n "$pc" ] || fail "no sinew.pc installed"
    PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    export PKG_CONFIG_PATH
    pc_version=$(pkg-config --modversion sinew) || fail "pkg-config cannot read $pc"
    [ "$pc_version" = "$version" ] || fail "sinew.pc says version $pc_version, the headers $version"
    flags=$(pkg-config --cflags --libs sinew)
    echo "pkg-config --cflags --libs sinew: $flags"
    printf '%s\n' "$flags" >"$work/flags"
    no_cpu_tuning "sinew.pc and pkg-config's flags" "$pc" "$work/flags"
    grep -q -F -- "-I$prefix/include" "$work/flags" || fail "pkg-config's flags do not name $prefix/include"
    # Word splitting of $flags is intended: pkg-config prints one shell-quoted command line.
    # shellcheck disable=SC2086
    run "$work/build.log" "${CXX:-c++}" -std=c++20 -O2 -o "$work/c" "$here/consumer/main.cpp" $flags
    runs_consumer "$work/c"
    ;;

  modulefile)
    modulefile=$(find "$prefix" -path "*/sinew/$version.lua")
    [ -n "$modulefile" ] || fail "no modulefile sinew/$version.lua installed"
    modulepath=$(dirname "$(dirname "$modulefile")")
    echo "modulefile: ${modulefile#"$prefix"/}"
    # A clean environment, as in a new login: nothing of Sinew or of its MPI on any path yet.
    cat >"$work/module.sh" <<'EOF'
set -eo pipefail
fail() { echo "FAIL (modulefile): $*" >&2; exit 1; }
source "$LMOD_INIT"
set -u
command -v sinew-train >/dev/null && fail "sinew-train is on PATH before module load"
module use "$MODULEPATH_DIR"
module load sinew
module is-loaded sinew || fail "module load sinew did not load it"
[ "$(command -v sinew-train)" = "$PREFIX/bin/sinew-train" ] || fail "sinew-train is $(command -v sinew-train)"
out=$(sinew-train --version) || fail "sinew-train --version failed: $out"
echo "sinew-train --version: $out"
grep -q -E "^sinew-train $VERSION( |$)" <<<"$out" || fail "sinew-train --version printed '$out'"
[ "$SINEW_ROOT" = "$PREFIX" ] || fail "SINEW_ROOT is '$SINEW_ROOT'"
# The scripts the batch templates call (hpc/slurm/): restart mode and the audit.
[ "$(command -v sinew-supervise)" = "$PREFIX/bin/sinew-supervise" ] || fail "sinew-supervise is not on PATH"
out=$(sinew-supervise --help) && grep -q -- '--launcher' <<<"$out" || fail "sinew-supervise --help failed: $out"
rc=0 && sinew-supervise --launcher srun -n 2 >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "sinew-supervise without a program exited $rc, not 2"
out=$(sinew-check-audit --help) && grep -q -- '--dataset-size' <<<"$out" || fail "sinew-check-audit --help failed: $out"
[ "$(command -v sinew-run)" = "$PREFIX/bin/sinew-run" ] || fail "sinew-run is not on PATH"
out=$(sinew-run --help) && grep -q -- '--hostfile' <<<"$out" || fail "sinew-run --help failed: $out"
echo "ok   sinew-run, sinew-supervise and sinew-check-audit on PATH"
if [ -n "$MPI_PREFIX" ]; then
  [ "$(command -v mpirun)" = "$MPI_PREFIX/bin/mpirun" ] || fail "mpirun is '$(command -v mpirun)', not $MPI_PREFIX's"
  echo "ok   mpirun is $MPI_PREFIX/bin/mpirun"
fi
[ "$(pkg-config --modversion sinew)" = "$VERSION" ] || fail "pkg-config does not find sinew.pc under the module"
# CMake finds Sinew and, through it, the MPI it was built with: no CMAKE_PREFIX_PATH or MPI_C_COMPILER given.
cmake -S "$CONSUMER" -B "$WORK/module-consumer" >"$WORK/module-configure.log" 2>&1 ||
  { cat "$WORK/module-configure.log"; fail "the consumer does not configure under the module"; }
if [ -n "$MPI_PREFIX" ]; then
  libmpi=$(sed -n 's/^MPI_mpi_LIBRARY:FILEPATH=//p' "$WORK/module-consumer/CMakeCache.txt")
  case $libmpi in "$MPI_PREFIX"/*) ;; *) fail "CMake took libmpi '$libmpi' under the module" ;; esac
fi
cmake --build "$WORK/module-consumer" >"$WORK/module-build.log" 2>&1 ||
  { cat "$WORK/module-build.log"; fail "the consumer does not build under the module"; }
"$WORK/module-consumer/c" || fail "the consumer built under the module failed"
module whatis sinew 2>&1 | grep -q "Version: $VERSION" || fail "module whatis sinew: no version"
module help sinew 2>&1 | grep -q "sinew-train" || fail "module help sinew: no help text"
module unload sinew
command -v sinew-train >/dev/null && fail "sinew-train is still on PATH after module unload"
[ -z "${SINEW_ROOT:-}" ] || fail "SINEW_ROOT is still set after module unload"
case ":$PATH:" in *":$PREFIX/"*) fail "PATH keeps $PREFIX/bin after unload: $PATH" ;; esac
if [ -n "$MPI_PREFIX" ]; then
  case ":$PATH:" in *":$MPI_PREFIX/"*) fail "PATH keeps $MPI_PREFIX/bin after unload: $PATH" ;; esac
fi
case ":${PKG_CONFIG_PATH:-}:${CMAKE_PREFIX_PATH:-}:" in
  *"$PREFIX"*) fail "PKG_CONFIG_PATH or CMAKE_PREFIX_PATH keep $PREFIX after unload" ;;
esac
echo "ok   module load sinew, sinew-train --version, module unload sinew"
EOF
    env -i HOME="$work" PATH=/usr/local/bin:/usr/bin:/bin TERM=dumb LMOD_INIT="$lmod_init" \
      MODULEPATH_DIR="$modulepath" PREFIX="$prefix" VERSION="$version" MPI_PREFIX="$mpi_prefix" \
      CONSUMER="$here/consumer" WORK="$work" bash --noprofile --norc "$work/module.sh" ||
      fail "the modulefile checks failed (above)"
    ;;

  *)
    fail "unknown mode '$mode' (find_package, pkg_config or modulefile)"
    ;;
esac
echo "passed: $mode"
