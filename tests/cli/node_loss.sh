#!/usr/bin/env bash
# A whole node lost, on the shaped test bed (hpc/net/): 4 hosts x 2 ranks under sinew-run. At step 20 host 3
# is lost as a node that loses power (testbed.sh lose: its links go dark, both its ranks and its PRRTE
# daemon are killed at once, its /dev/shm is emptied). PRRTE 3.0.8 ends the whole job when it loses a
# daemon (and mpirun returns 0); sinew-run sees the lost node, leaves it out, and relaunches on the 3 hosts
# left (6 ranks), which go on from the state their own nodes kept in memory (--state-mirror), at the step
# where the job stopped, not from the last checkpoint. Asserts: exit 0; a relaunch at 6 ranks without host 3;
# the resume from node memory at the last step the job reached, read from a host that survived; the lost
# host's memory gone; test accuracy within TOLERANCE points of the failure-free reference (the elastic
# scenarios' fixture: the same global batch of 128); every sample exactly once (the audit); and the time
# from the loss to training back at the failed step (printed).
#
# Usage: node_loss.sh WORKDIR SINEW_TRAIN REFERENCE. Needs root (network namespaces); skipped (exit 77)
# where the bed cannot be built.
set -u
workdir=$1
train=$2
reference=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
net=$root/hpc/net
tolerance=3.0
limit=8192
epochs=2
scenario=node-loss

. "$here/lib.sh"
need_fashion_mnist "$scenario"
need_testbed "$scenario"
mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
testbed_up "$scenario" 4 unlimited "$d/bed.txt"
trap '"$net/testbed.sh" down >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT
printf 'sinew-h%d slots=2\n' 1 2 3 4 >"$d/hosts"

# The loss, once training has reached step 20 (its Unix time to $d/lost_time).
(
  for _ in $(seq 1 2400); do
    s=$(grep -o '"step":[0-9]*' "$d/metrics.jsonl" 2>/dev/null | tail -n 1 | cut -d: -f2)
    if [ -n "$s" ] && [ "$s" -ge 20 ]; then
      date +%s.%N >"$d/lost_time"
      "$net/testbed.sh" lose 3
      ls -A /dev/shm/sinew-bed/h3 >"$d/h3_after_loss"
      exit 0
    fi
    sleep 0.02
  done
) &
loser=$!

timeout -k 5 150 "$root/mpi_scripts/sinew-run" --mpirun "$net/mpirun.sh --as-mpirun" --hostfile "$d/hosts" \
  --events "$d/supervise.jsonl" -- "$train" --dataset fashion-mnist --limit-train $limit --limit-test 2000 \
  --model mlp:64 --epochs $epochs --batch-size 16 --progress false --log-every 1 --step-sleep-ms 20 \
  --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --checkpoint-dir "$d/ckpt" --checkpoint-every 50 \
  --lr 0.05 --timeout-ms 30000 >"$d/out.txt" 2>&1
rc=$?
wait $loser

ok=1
[ "$rc" -eq 0 ] || { echo "FAIL $scenario: exit $rc (expected 0)"; ok=0; }
[ -f "$d/lost_time" ] || { echo "FAIL $scenario: training never reached step 20, so no node was lost"; ok=0; }
if [ $ok -eq 1 ]; then
  python3 "$here/check_run.py" "$d/metrics.jsonl" --reference "$reference" --tolerance $tolerance \
    --event resume --final-world-size 6 || ok=0
  python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $limit --epochs $epochs || ok=0
  python3 - "$d" "$(cat "$d/lost_time")" <<'EOF' || ok=0
import json, sys
d, lost = sys.argv[1], float(sys.argv[2])
bad = []
launches = [json.loads(l) for l in open(f"{d}/supervise.jsonl") if '"launch"' in l]
if len(launches) < 2 or launches[-1]["ranks"] != 6:
    bad.append(f"launches {[(e['generation'], e['ranks']) for e in launches]}: expected a relaunch at 6 ranks")
out = open(f"{d}/out.txt", errors="replace").read()
if "node sinew-h3 lost" not in out:
    bad.append("sinew-run did not report host 3 as lost")
if open(f"{d}/h3_after_loss").read().strip():
    bad.append("host 3's /dev/shm was not emptied by its loss")
steps = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"loss"' in l]
before = max(e["step"] for e in steps if e["unix_time"] < launches[-1]["unix_time"])
memory = [json.loads(l) for l in open(f"{d}/metrics.jsonl") if '"event":"resume"' in l and '.bin"' in l]
if not memory:
    bad.append("no resume from node memory")
else:
    m = memory[-1]
    if "sinew-h3" in m["path"]:
        bad.append(f"resumed from the lost host's memory: {m['path']}")
    if m["step"] < before:
        bad.append(f"resumed at step {m['step']}, but the job had reached step {before}")
    after = min(e["unix_time"] for e in steps if e["unix_time"] >= launches[-1]["unix_time"] and e["step"] > before)
    print(f"node lost at step {before}; relaunched at 6 ranks; resumed from {m['path']} at step {m['step']}; "
          f"training back at the failed step {after - lost:.2f} s after the loss")
if bad:
    sys.exit("FAIL node-loss: " + "; ".join(bad))
EOF
fi
if [ $ok -ne 1 ]; then
  echo "---- last lines of the job's output ----"
  grep -av 'checkpoint committed' "$d/out.txt" | tail -n 40
  exit 1
fi
echo "ok   net.$scenario"
