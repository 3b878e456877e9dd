#!/usr/bin/env bash
# sinew-ckpt's command-line contract: list, inspect, verify, export and diff on real checkpoints, the
# documented exit codes (0 ok, 1 diff above tolerance, 2 usage, 4 bad checkpoint) and messages that name
# the problem. The checkpoints come from `sinew-train --checkpoint-dir` (2 ranks, steps 5 and 10).
# Usage: ckpt_cli.sh SINEW_CKPT SINEW_TRAIN MPIEXEC [MPIEXEC_FLAGS...]
set -u
ckpt=$1
train=$2
shift 2
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# check NAME CONDITION-COMMAND...   (a plain true/false check)
check() {
  local name=$1
  shift
  if "$@"; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
  fi
}

# --- the checkpoints -----------------------------------------------------------------------------
d=$work/ck
if ! timeout 180 "${mpiexec[@]}" -n 2 "$train" --dataset synthetic --model mlp:16 --epochs 1 --max-steps 10 \
  --checkpoint-dir "$d" --checkpoint-every 5 --progress false >"$work/make.log" 2>&1; then
  echo "FAIL: sinew-train did not write the checkpoints:"
  sed 's/^/     | /' "$work/make.log" | tail -n 30
  exit 1
fi
c5=$d/ckpt-0000000005
c10=$d/ckpt-0000000010
if [ ! -f "$c5/manifest.h5" ] || [ ! -f "$c10/manifest.h5" ]; then
  echo "FAIL: expected committed checkpoints of steps 5 and 10 in $d, found:"
  ls -la "$d" 2>&1 | sed 's/^/     | /'
  exit 1
fi
# An abandoned write: listed as ignored, never as a checkpoint.
mkdir -p "$d/ckpt-0000000099.partial"

# --- list ----------------------------------------------------------------------------------------
expect list 0 "2 committed \(2 valid\), 1 uncommitted" -- "$ckpt" list "$d"
out=$("$ckpt" list "$d" 2>&1)
check list-newest-first bash -c '[ "$(grep -n ckpt-0000000010 <<<"$1" | cut -d: -f1)" -lt "$(grep -n "ckpt-0000000005 " <<<"$1" | cut -d: -f1)" ]' _ "$out"
expect list-partial 0 "ckpt-0000000099.partial +partial \(ignored\)" -- "$ckpt" list "$d"
expect list-valid 0 "ckpt-0000000005 +valid" -- "$ckpt" list "$d"
expect list-json 0 '"state": "partial"' -- "$ckpt" list "$d" --json
expect list-json-step 0 '"step": 10' -- "$ckpt" list "$d" --json
expect list-missing-dir 4 "$work/nowhere" -- "$ckpt" list "$work/nowhere"

# --- inspect -------------------------------------------------------------------------------------
expect inspect-world 0 "world size +2 " -- "$ckpt" inspect "$c10"
expect inspect-step 0 "^step +10 " -- "$ckpt" inspect "$c10"
expect inspect-tensor 0 "^params +[0-9]+ +2 +[0-9a-f]{8} [0-9a-f]{8}$" -- "$ckpt" inspect "$c10"
expect inspect-manifest-path 0 "schema version +2" -- "$ckpt" inspect "$c10/manifest.h5"
expect inspect-json 0 '"world_size": 2' -- "$ckpt" inspect "$c10" --json
expect inspect-missing 4 "$work/nope/ckpt-0000000001: no such checkpoint" -- "$ckpt" inspect "$work/nope/ckpt-0000000001"
expect verify-missing 4 "$work/nope/ckpt-0000000001: INVALID: .*no such checkpoint" -- "$ckpt" verify "$work/nope/ckpt-0000000001"

# --- verify --------------------------------------------------------------------------------------
expect verify-ok 0 "ckpt-0000000010: OK" -- "$ckpt" verify "$c5" "$c10"
mkdir -p "$work/bad"
cp -r "$c10" "$work/bad/"
bad=$work/bad/ckpt-0000000010
shard=$bad/shard-00001-of-00002.h5
head -c $(($(stat -c %s "$shard") / 2)) "$shard" >"$shard.x" && mv "$shard.x" "$shard"
expect verify-truncated-shard 4 "INVALID: .*shard-00001-of-00002.h5" -- "$ckpt" verify "$c5" "$bad"
expect verify-reports-each 4 "ckpt-0000000005: OK" -- "$ckpt" verify "$c5" "$bad"
expect list-shows-invalid 0 "INVALID: .*shard-00001-of-00002.h5" -- "$ckpt" list "$work/bad"

# --- diff ----------------------------------------------------------------------------------------
expect diff-self 0 "^0 of [0-9]+ tensors differ" -- "$ckpt" diff "$c10" "$c10"
expect diff-self-scalars 0 "scalar fields: identical" -- "$ckpt" diff "$c10" "$c10"
expect diff-self-tolerance 0 "within tolerance 0" -- "$ckpt" diff "$c10" "$c10" --tolerance 0
expect diff-steps 0 "step +5 vs 10" -- "$ckpt" diff "$c5" "$c10"
expect diff-tolerance-exceeded 1 "tolerance 0 exceeded by: .*params" -- "$ckpt" diff "$c5" "$c10" --tolerance 0
expect diff-json 0 '"tensors_differing": 0' -- "$ckpt" diff "$c10" "$c10" --json
expect diff-damaged 4 "shard-00001-of-00002.h5" -- "$ckpt" diff "$c10" "$bad"

# --- export --------------------------------------------------------------------------------------
expect export 0 "plain.h5: step 10" -- "$ckpt" export "$c10" "$work/plain.h5"
check export-file-exists test -s "$work/plain.h5"
expect export-no-overwrite 2 "already exists; pass --force" -- "$ckpt" export "$c10" "$work/plain.h5"
expect export-force 0 "plain.h5: step 5" -- "$ckpt" export "$c5" "$work/plain.h5" --force
expect export-damaged 4 "shard-00001-of-00002.h5" -- "$ckpt" export "$bad" "$work/bad.h5"
check export-damaged-writes-nothing test ! -e "$work/bad.h5"
if command -v h5dump >/dev/null 2>&1; then
  expect export-readable 0 "tensors" -- h5dump -H "$work/plain.h5"
  # The manifest's virtual datasets show whole tensors through the shards, whatever the current
  # directory (relative source paths resolve against the manifest's directory): the same bytes as the
  # export of the same checkpoint. (A missing shard would read as zeros, silently: HDF5 fills.)
  h5dump -d /tensors/params -b LE -o "$work/plain.bin" "$work/plain.h5" >/dev/null 2>&1
  (cd / && h5dump -d /tensors/params -b LE -o "$work/virtual.bin" "$c5/manifest.h5" >/dev/null 2>&1)
  check manifest-virtual-datasets-read-through-shards cmp -s "$work/plain.bin" "$work/virtual.bin"
  check virtual-dataset-not-empty test -s "$work/virtual.bin"
else
  skip h5dump-checks "h5dump is not installed (hdf5-tools)"
fi

# --- usage errors: exit 2, one line --------------------------------------------------------------
expect no-command 2 "missing command" -- "$ckpt"
expect unknown-command 2 "unknown command 'frobnicate'" -- "$ckpt" frobnicate
expect list-missing-arg 2 "sinew-ckpt list: missing DIR" -- "$ckpt" list
expect diff-missing-arg 2 "sinew-ckpt diff: missing A B" -- "$ckpt" diff "$c10"
expect export-extra-arg 2 "unexpected argument" -- "$ckpt" export "$c10" "$work/x.h5" "$work/y.h5"
expect unknown-option 2 "unrecogni[sz]ed option '--bogus'" -- "$ckpt" inspect "$c10" --bogus
expect bad-tolerance 2 "tolerance" -- "$ckpt" diff "$c10" "$c10" --tolerance abc
expect negative-tolerance 2 "tolerance" -- "$ckpt" diff "$c10" "$c10" --tolerance=-1
out=$("$ckpt" frobnicate 2>&1)
check usage-error-one-line test "$(wc -l <<<"$out")" -eq 1
expect help 0 "usage: sinew-ckpt COMMAND" -- "$ckpt" --help
expect command-help 0 "usage: sinew-ckpt diff A B" -- "$ckpt" diff --help

# --- the commit record, and checkpoints of schema version 1 ------------------------------------------
check commit-record grep -qE '^manifest\.h5 [0-9a-f]{8} [0-9]+$' "$c10/COMMITTED"
mkdir -p "$work/uncommitted" && cp -r "$c10" "$work/uncommitted/" && rm "$work/uncommitted/ckpt-0000000010/COMMITTED"
expect verify-uncommitted 4 "not committed" -- "$ckpt" verify "$work/uncommitted/ckpt-0000000010"
expect list-uncommitted 0 "ckpt-0000000010 +uncommitted \(ignored\)" -- "$ckpt" list "$work/uncommitted"
# Written by the Sinew before the commit record (renamed from .partial, manifest.h5.crc32): still loads,
# and a run resumes from it at another world size.
old=$(dirname "${BASH_SOURCE[0]}")/data/schema1
expect verify-schema1 0 "ckpt-0000000010: OK" -- "$ckpt" verify "$old/ckpt-0000000010"
expect inspect-schema1 0 "schema version +1" -- "$ckpt" inspect "$old/ckpt-0000000010"
cp -r "$old" "$work/schema1"
expect resume-schema1 0 "resumed from $work/schema1/ckpt-0000000010 \(step 10" -- \
  "${mpiexec[@]}" -n 3 "$train" --dataset synthetic --model mlp:16 --epochs 1 --max-steps 12 \
  --checkpoint-dir "$work/schema1" --progress false
expect resumed-writes-schema2 0 "schema version +2" -- "$ckpt" inspect "$work/schema1/ckpt-0000000012"

finish
