# Shared by the command-line test scripts: counters, expect(), skip(), need_fashion_mnist and finish. Source it; end with
# `finish`, which prints the summary and gives the script's exit code: 1 if any case failed, else 77 if any
# case was skipped (ctest shows the test as skipped: SKIP_RETURN_CODE 77 in tests/cli/CMakeLists.txt,
# never as passed when part of it did not run), else 0.
passed=0
failed=0
skipped=0

# skip NAME REASON: a case that cannot run here (a tool or data set missing, not root).
skip() {
  skipped=$((skipped + 1))
  echo "SKIP $1: $2"
}

finish() {
  echo "$passed passed, $failed failed, $skipped skipped"
  if [ "$failed" -ne 0 ]; then exit 1; fi
  if [ "$skipped" -ne 0 ]; then exit 77; fi
  exit 0
}

# expect NAME CODE PATTERN -- COMMAND...   (exit code and an extended regex in stdout+stderr)
expect() {
  local name=$1 code=$2 pattern=$3
  shift 4
  local out rc
  out=$(timeout 120 "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$code" ] && grep -q -E -- "$pattern" <<<"$out"; then
    passed=$((passed + 1))
    echo "ok   $name (exit $rc)"
  else
    failed=$((failed + 1))
    echo "FAIL $name: expected exit $code and /$pattern/, got exit $rc:"
    sed 's/^/     | /' <<<"$out" | head -n 30
  fi
}

# need_fashion_mnist NAME: exits 77 (skipped) unless Fashion-MNIST is installed; sets fm to its folder.
# need_testbed NAME: the shaped test bed (hpc/net/) needs root, ip and tc; skipped (exit 77) without them.
need_testbed() {
  if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
    echo "SKIP $1: the test bed needs root, ip and tc (network namespaces)"
    exit 77
  fi
}

# testbed_up NAME HOSTS RATE LOG: brings the bed up (its output to LOG); skipped (exit 77) where network
# namespaces are refused. The caller removes it (testbed.sh down) in its EXIT trap.
testbed_up() {
  local bed
  bed="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/hpc/net/testbed.sh"
  if ! "$bed" up "$2" "$3" >"$4" 2>&1; then
    cat "$4"
    "$bed" down >/dev/null 2>&1
    echo "SKIP $1: the test bed could not be built here (network namespaces refused)"
    exit 77
  fi
}

need_fashion_mnist() {
  fm=/usr/share/datasets/fashion-mnist
  if [ ! -f "$fm/train-images-idx3-ubyte.gz" ]; then
    echo "SKIP $1: $fm is not installed (dataset-fashion-mnist; mpi_scripts/setup.sh installs it)"
    exit 77
  fi
}
