# Shared by the command-line test scripts: counters and expect(). Source it; end with the summary line.
passed=0
failed=0

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
