#!/usr/bin/env bash
# Network faults on the shaped test bed (hpc/net/): hosts whose data link goes dark, or that are cut off from
# the others, while their processes stay alive. Sinew's failure detector (membership::Liveness, default
# configuration: --stall-timeout-ms 10000) must exclude them within the stated deadline, the cut-off
# processes must fence themselves (no metrics line, audit record or checkpoint after their exclusion), and
# the rest must finish the training in place: exit 0, test accuracy within TOLERANCE points of the
# failure-free reference (the elastic scenarios' fixture: the same training at 4 ranks), every sample
# exactly once (the audit).
#
# Usage: net_faults.sh SCENARIO WORKDIR SINEW_TRAIN REFERENCE   (REFERENCE: the reference run's accuracy file)
#   link-down   host 3 (rank 2) loses its data link at step 20: the other 3 go on
#   partition   hosts 3 and 4 are cut off from hosts 1 and 2: an even split, the half with rank 0 goes on
#   rank0-cut   host 1 (rank 0, and mpirun) loses its data link: the others go on, a new rank 0 writes
#   spare       5 hosts, --spares 1 (on host 5): host 2 is cut off and the spare takes its place
# Without spares the group goes on smaller (--grow false): PRRTE 3.0.8 logs "PMIX ERROR ...
# pmix_server_dyn.c at line 1048" for every spawn across its daemons, and then mpirun itself died of heap
# corruption at the end of the job in about 1 run of 6, even for a 20-line spawn program without any
# fault; spawning back after a cut (onto a host the group reaches) is covered by the chaos driver.
# The links run at 50 Mbit/s, so that the 128 steps take seconds and the cut lands mid-training (unshaped,
# the job could finish before the cut took effect). Needs root (network namespaces); skipped (exit 77) where
# the bed cannot be built.
set -u
scenario=$1
workdir=$2
train=$3
reference=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
net=$root/hpc/net
tolerance=3.0
limit=8192
epochs=2
stall_ms=10000
deadline_s=$((stall_ms / 1000 + 5))  # the stated exclusion deadline: the stall timeout, plus 5 s

. "$here/lib.sh"
need_fashion_mnist "$scenario"
need_testbed "$scenario"

case $scenario in
  link-down) hosts=4; cut=(cut 3); extra=(--grow false); lost=1; promoted=0; final=3 ;;
  partition) hosts=4; cut=(partition 3 4); extra=(--grow false); lost=2; promoted=0; final=2 ;;
  rank0-cut) hosts=4; cut=(cut 1); extra=(--grow false); lost=1; promoted=0; final=3 ;;
  spare) hosts=5; cut=(cut 2); extra=(--spares 1); lost=1; promoted=1; final=4 ;;
  *) echo "unknown scenario '$scenario'" >&2; exit 2 ;;
esac

mkdir -p "$workdir"
d=$(mktemp -d -p "$workdir")
testbed_up "$scenario" "$hosts" 50mbit "$d/bed.txt"
trap '"$net/testbed.sh" down >/dev/null 2>&1; [ -n "${KEEP:-}" ] || rm -rf "$d"' EXIT

# The cut, once training has reached step 20 (written to $d/cut_time as a Unix time).
(
  for _ in $(seq 1 2400); do
    s=$(grep -o '"step":[0-9]*' "$d/metrics.jsonl" 2>/dev/null | tail -n 1 | cut -d: -f2)
    if [ -n "$s" ] && [ "$s" -ge 20 ]; then
      date +%s.%N >"$d/cut_time"
      "$net/testbed.sh" "${cut[@]}"
      exit 0
    fi
    sleep 0.05
  done
) &
cutter=$!

timeout -k 5 150 "$net/mpirun.sh" "$hosts" -- "$train" --dataset fashion-mnist --limit-train $limit \
  --limit-test 2000 --model mlp:64 --epochs $epochs --batch-size 32 --progress false --log-every 5 \
  --metrics "$d/metrics.jsonl" --audit-dir "$d/audit" --checkpoint-dir "$d/ckpt" --checkpoint-every 25 \
  --lr 0.05 --timeout-ms 30000 --stall-timeout-ms $stall_ms --elastic inplace "${extra[@]}" >"$d/out.txt" 2>&1 &
job=$!
# A job still running after 120 s hangs: the stacks of its processes (gdb) go into the output, for the
# report, before `timeout` ends it at 150 s.
for _ in $(seq 1 1200); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null && command -v gdb >/dev/null; then
  for p in $(pgrep -f "$d/metrics.jsonl"); do
    [ "$(cat /proc/$p/comm 2>/dev/null)" = sinew-train ] || continue
    echo "==== stacks of pid $p ($(ip netns identify $p 2>/dev/null))" >>"$d/stacks.txt"
    timeout 30 gdb -p $p -batch -nx -ex 'thread apply all bt' >>"$d/stacks.txt" 2>&1
  done
fi
wait $job
rc=$?
ended=$(date +%s.%N)
wait $cutter

ok=1
[ "$rc" -eq 0 ] || { echo "FAIL $scenario: exit $rc (expected 0)"; ok=0; }
[ -f "$d/cut_time" ] || { echo "FAIL $scenario: training never reached step 20, so nothing was cut"; ok=0; }
if [ $ok -eq 1 ]; then
  python3 "$here/check_run.py" "$d/metrics.jsonl" --reference "$reference" \
    --tolerance $tolerance --final-world-size $final || ok=0
  python3 "$root/mpi_scripts/check-audit.py" "$d/audit" --dataset-size $limit --epochs $epochs || ok=0
  # Exclusion: from the cut to the survivors' detection of the failure; the fenced processes (their own
  # log line) wrote nothing after it; the job ended soon after its `done` line.
  python3 - "$d" "$(cat "$d/cut_time")" "$ended" "$lost" "$deadline_s" "$promoted" <<'EOF' || ok=0
import glob, json, os, re, sys
d, cut, ended, lost, deadline = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
promoted = int(sys.argv[6])
events = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
fails = [e for e in events if e.get("event") in ("failure", "failure.promoted")]
done = [e for e in events if e.get("event") == "done"]
bad = []
if not fails:
    sys.exit("FAIL: no failure event: the cut hosts were never excluded")
excl = fails[0]["detected_unix_time"] - cut
print(f"excluded {excl:.2f} s after the cut (deadline {deadline:.0f} s; {fails[0]['event']}, lost {fails[0]['lost']})")
if excl > deadline:
    bad.append(f"excluded {excl:.2f} s after the cut, past the {deadline:.0f} s deadline")
if sum(e["lost"] for e in fails) != lost:
    bad.append(f"{sum(e['lost'] for e in fails)} processes lost, expected {lost}")
if sum(e.get("promoted", 0) for e in fails) != promoted:
    bad.append(f"{sum(e.get('promoted', 0) for e in fails)} hot spares promoted, expected {promoted}")
out = open(f"{d}/out.txt", errors="replace").read()
fenced = re.findall(r"this process \((\d+) on (\S+)\) is cut off", out)
if len(fenced) != lost:
    bad.append(f"{len(fenced)} processes fenced themselves, expected {lost}")
for pid, host in fenced:
    for f in glob.glob(f"{d}/audit/audit-{host}-{pid}.txt"):
        late = os.path.getmtime(f) - fails[0]["detected_unix_time"]
        if late > 0:
            bad.append(f"fenced process {pid} on {host} wrote its audit {late:.3f} s after its exclusion")
if done and ended - done[-1]["unix_time"] > 15:
    bad.append(f"the job ended {ended - done[-1]['unix_time']:.1f} s after its done line (limit 15 s)")
if bad:
    sys.exit("FAIL: " + "; ".join(bad))
print(f"fenced themselves: {', '.join(f'{p} on {h}' for p, h in fenced)}; nothing written after exclusion")
EOF
fi
if [ $ok -ne 1 ]; then
  echo "---- last lines of the job's output ----"
  grep -av 'checkpoint committed' "$d/out.txt" | tail -n 40
  if [ -f "$d/stacks.txt" ]; then
    echo "---- where the processes were at 120 s ----"
    grep -a -E '^====|^#[0-9]+ .* in (sinew::|MPI|PMPI|ompi_|mca_)' "$d/stacks.txt" | head -n 80
  fi
  exit 1
fi
echo "ok   net.$scenario"
