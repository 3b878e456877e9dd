#!/usr/bin/env bash
# The scale model end to end (docs/scale.md): builds sinew-sim (and Sinew, which the calibration runs),
# calibrates the model on this machine, checks it against the calibration at 4 ranks, simulates the
# sweep (4 ... 16 384 ranks on three platforms), the validation against published figures, and writes
# the tables (hpc/sim/results/tables.md) and plots (docs/img/scale_*.png), and the sharded training
# state's step and recovery (sim.py shard: ZeRO-1, 2 and 3, hdr200).
#
# usage: hpc/sim/run.sh [--no-calibrate] [--quick]
#   --no-calibrate  keep hpc/sim/calibration.json as it is (the measurements take ~2 minutes).
#                   Without it, the fresh calibration goes to a temporary file and replaces
#                   hpc/sim/calibration.json only once the model reproduces it (sim.py check).
#   --quick         a smoke run: a quick calibration into a temporary file (one round: too noisy to check
#                   the model against, so only fitted), then the check and a sweep to 256 ranks on
#                   hpc/sim/calibration.json, results and plots into a temporary folder
# Exit codes: 0 done; 1 the model misses the calibration (sim.py check) or a step failed; 2 usage;
#   3 the model misses the fresh calibration: hpc/sim/calibration.json was kept as it was, the fresh one
#   is left where the message says (a busy or slow machine inflates the measurements: rerun later, or
#   use --no-calibrate).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$here/../../mpi_scripts/env.sh"

calibrate=1 quick=0
for a in "$@"; do
  case "$a" in
    --no-calibrate) calibrate=0 ;;
    --quick) quick=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option '$a' (use --no-calibrate, --quick)" >&2; exit 2 ;;
  esac
done

start=$(date +%s)
say() { printf '[sinew-sim %4ds] %s\n' "$(( $(date +%s) - start ))" "$*"; }

pkg-config --exists simgrid || { echo "run.sh: SimGrid is missing: run mpi_scripts/setup.sh (libsimgrid-dev)" >&2; exit 1; }
# Sinew's build (the calibration runs sinew-train and sinew-bench) and sinew-sim with it; a configure that
# ran before SimGrid was installed is redone by build.sh.
say "building Sinew and sinew-sim (mpi_scripts/build.sh)"
bash "$here/../../mpi_scripts/build.sh" >/dev/null
sim=$SINEW_BUILD_DIR/hpc/sim/sinew-sim
# Finished simulations are kept (keyed by binary, calibration and arguments): a rerun after an
# interruption, or with the same calibration, does only what is left.
export SINEW_SIM_CACHE=${SINEW_SIM_CACHE:-$SINEW_BUILD_DIR/hpc/sim/cache.jsonl}
[ -x "$sim" ] || { echo "run.sh: $sim was not built (is SimGrid's pkg-config file found?)" >&2; exit 1; }

calibration=$here/calibration.json
results=$here/results
ranks=()  # sim.py's sweep: 4 ... 16 384 ranks (docs/scale.md says which platform goes how far)
if [ "$quick" = 1 ]; then
  results=$(mktemp -d)
  # shellcheck disable=SC2054  # one argument, sim.py's comma-separated list
  ranks=(--ranks 4,16,64,256)
  quick_calibration=$results/calibration.json
  say "quick: calibration into $quick_calibration, results into $results"
  /usr/bin/python3 "$here/calibrate.py" --quick --out "$quick_calibration"
  "$sim" fit --calibration "$quick_calibration" >/dev/null
  say "quick: the calibration's measurements fit; the check and the sweep use $calibration"
elif [ "$calibrate" = 1 ]; then
  fresh_dir=$(mktemp -d)
  fresh=$fresh_dir/calibration.json
  say "calibrating on this machine (hpc/sim/calibrate.py, ~2 min) into $fresh"
  /usr/bin/python3 "$here/calibrate.py" --out "$fresh"
  say "the model against the fresh calibration at 4 ranks"
  rc=0
  /usr/bin/python3 "$here/sim.py" check --sim "$sim" --calibration "$fresh" || rc=$?
  if [ "$rc" = 1 ]; then
    cat >&2 <<EOF
run.sh: the model misses the fresh calibration (the FAILED rows above), so hpc/sim/calibration.json was
  kept as it was and nothing was regenerated; the fresh one is $fresh.
  A busy or throttled machine slows 3 and 4 ranks (more processes than cores) unevenly (the lines
  above say what the calibration saw): rerun later, or run 'hpc/sim/run.sh --no-calibrate' to
  regenerate the results from the kept calibration.
EOF
    exit 3
  fi
  [ "$rc" = 0 ] || exit "$rc"
  cp "$fresh" "$calibration.tmp" && mv "$calibration.tmp" "$calibration"
  rm -r "$fresh_dir"
  say "installed the fresh calibration as hpc/sim/calibration.json"
fi

if [ "$calibrate" = 0 ] || [ "$quick" = 1 ]; then
  say "the model against the calibration at 4 ranks"
  /usr/bin/python3 "$here/sim.py" check --sim "$sim" --calibration "$calibration"
fi
say "sweep: hdr200, edr100, eth10 ${ranks[*]}"
/usr/bin/python3 "$here/sim.py" sweep --sim "$sim" --calibration "$calibration" "${ranks[@]}" \
  --out "$results/sweep.json"
say "sharded training state (ZeRO-1, 2, 3): R = 1, 2 and unsharded on hdr200"
/usr/bin/python3 "$here/sim.py" shard --sim "$sim" --calibration "$calibration" "${ranks[@]}" --out "$results/shard.json"
say "validation against published figures"
/usr/bin/python3 "$here/sim.py" validate --sim "$sim" --calibration "$calibration" --out "$results/validation.json"
img=$here/../../docs/img
[ "$quick" = 1 ] && img=$results/img
/usr/bin/python3 "$here/sim.py" report --results "$results/sweep.json" --validation "$results/validation.json" \
  --img "$img" --tables "$results/tables.md" --shard "$results/shard.json"
say "done"
