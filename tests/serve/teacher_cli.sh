#!/usr/bin/env bash
# sinew-teacher on the command line: its usage errors and exit codes, and a whole serve run (ready file, the
# "serving" line, SIGTERM ends it with exit 0). ctest cli.teacher_bad_input.
#
# Usage: teacher_cli.sh SINEW_TEACHER SINEW_TRAIN WORKDIR
# SINEW_TRAIN makes the checkpoint of the serve run (synthetic data); where it is not built, that case is
# skipped (exit 77).
set -u
teacher=$1
train=$2
workdir=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cli/lib.sh
. "$here/../cli/lib.sh"

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
server_pid=
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$d"
}
trap cleanup EXIT
unset SINEW_JOB_TOKEN
echo "cli-test-token" >"$d/token"
: >"$d/empty-token"

expect "no command" 2 "no command given" -- "$teacher"
expect "unknown command" 2 "unknown command 'bogus'" -- "$teacher" bogus
expect "help" 0 "serve " -- "$teacher" --help
expect "serve help" 0 "--checkpoint" -- "$teacher" serve --help
expect "bad option" 2 "unrecognised|unrecognized" -- "$teacher" serve --checkpoint "$d" --bogus
expect "no checkpoint option" 2 "checkpoint" -- "$teacher" serve --token-file "$d/token"
expect "no token" 2 "no job token.*SINEW_JOB_TOKEN" -- "$teacher" serve --checkpoint "$d/missing"
expect "empty token file" 2 "is empty" -- "$teacher" serve --checkpoint "$d/missing" --token-file "$d/empty-token"
expect "unreadable token file" 2 "cannot read" -- "$teacher" serve --checkpoint "$d/missing" --token-file "$d/nope"
expect "missing checkpoint" 4 "$d/missing: no such directory" -- \
  "$teacher" serve --checkpoint "$d/missing" --token-file "$d/token"
expect "empty checkpoint root" 4 "holds no usable committed checkpoint" -- \
  env SINEW_JOB_TOKEN=from-env "$teacher" serve --checkpoint "$d"
expect "bad listen address" 2 "expected HOST:PORT" -- \
  "$teacher" serve --checkpoint "$d" --token-file "$d/token" --listen localhost

# A whole run: a checkpoint of synthetic data, served until SIGTERM.
if [ ! -x "$train" ]; then
  skip "serve run" "$train is not built"
  finish
fi
if ! timeout 120 "$train" --dataset synthetic --model mlp:16 --epochs 1 --limit-train 1000 --limit-test 200 \
  --progress false --checkpoint-dir "$d/run" >"$d/train.txt" 2>&1; then
  echo "FAIL: could not train the teacher's checkpoint:"
  tail -n 20 "$d/train.txt"
  exit 1
fi
SINEW_JOB_TOKEN=cli-test-token "$teacher" serve --checkpoint "$d/run" --listen 127.0.0.1:0 \
  --ready-file "$d/ready" >"$d/serve.out" 2>"$d/serve.err" &
server_pid=$!
for _ in $(seq 300); do
  [ -s "$d/ready" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
address=$(cat "$d/ready" 2>/dev/null)
line=$(head -n 1 "$d/serve.out")
if [[ "$address" =~ ^127\.0\.0\.1:[0-9]+$ ]] && [ "$line" = "serving mlp:16 (step 16) on $address" ]; then
  passed=$((passed + 1))
  echo "ok   serve: $line"
else
  failed=$((failed + 1))
  echo "FAIL serve: ready file '$address', first line '$line'; stderr:"
  sed 's/^/     | /' "$d/serve.err" | tail -n 20
fi
# The same port again: a second teacher cannot listen there (exit 6).
expect "port in use" 6 "cannot listen on $address" -- \
  "$teacher" serve --checkpoint "$d/run" --token-file "$d/token" --listen "$address"

kill -TERM "$server_pid"
rc=0
for _ in $(seq 100); do
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$server_pid" 2>/dev/null; then
  failed=$((failed + 1))
  echo "FAIL SIGTERM: the teacher still runs 10 s later"
  kill -KILL "$server_pid"
else
  wait "$server_pid" || rc=$?
  if [ "$rc" -eq 0 ]; then
    passed=$((passed + 1))
    echo "ok   SIGTERM: exit 0"
  else
    failed=$((failed + 1))
    echo "FAIL SIGTERM: exit $rc; stderr:"
    sed 's/^/     | /' "$d/serve.err" | tail -n 20
  fi
fi
server_pid=
finish
