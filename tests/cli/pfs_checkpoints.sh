#!/usr/bin/env bash
# Checkpoints on a real parallel file system: a GlusterFS volume on this machine (hpc/pfs/glusterfs.sh),
# mounted twice, as two nodes would: the job writes through one mount, readers look through the other.
#
#   commit-scan  two ranks commit 200 checkpoints (one a step) while a reader on the second mount
#                (pfs_scan.py) reads the directory and waits for each next one by name (a lookup of
#                ckpt-<N>/COMMITTED, as a job waiting for step N does), lists it with sinew-ckpt, and
#                verifies every checkpoint it sees committed, retrying 2 s for files not visible yet. Fails
#                on a checkpoint the job could not commit, on one seen committed that then does not verify
#                (broken) or disappears (lost); at the end all 200 must be valid and verify from both
#                mounts. The rename commit failed this: directories renamed under such a reader lost files
#                for good (9 and 16 of 200 in two runs here).
#   brick-loss   distribute over 6 bricks (PFS_BRICKS). Two ranks checkpoint every 10 steps; then the brick
#                that holds a file of the newest checkpoint (and none of an older one) is killed, and a
#                resume (--resume-wait 3) must say which files are missing, wait 3 s, fall back to that
#                older checkpoint and say how many steps are lost, and finish. Then, with the brick killed
#                again and started ~2 s into a resume (--resume-wait 20), the resume must take the newest
#                checkpoint and say that its files reappeared. (A whole file lives on one brick, picked by
#                a hash of its name within ranges that each directory rotates by a hash of its path; a killed
#                brick's files read as missing, ENOENT, not as I/O errors. 6 bricks, not 4: five files a
#                checkpoint, as with a manifest.h5.crc32 next to the commit record, covered all 4 bricks
#                in every directory, and then no brick loss leaves an older checkpoint whole.)
#
# Usage: pfs_checkpoints.sh SCENARIO SINEW_TRAIN SINEW_CKPT MPIEXEC [MPIEXEC_FLAGS...]
# The volume lives in $SINEW_PFS_TEST_DIR (default /tmp/sinew-pfs-test), brought up here and taken down at
# the end. Skipped (77) without root, FUSE or GlusterFS. KEEP=1 keeps the logs (the folder is printed).
set -u
scenario=$1
train=$2
ckpt=$3
shift 3
mpiexec=("$@")
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
pfs=$root/hpc/pfs/glusterfs.sh
# Our own folder: never the volume someone brought up by hand (one glusterd per machine: port 24007).
export SINEW_PFS_DIR=${SINEW_PFS_TEST_DIR:-/tmp/sinew-pfs-test}
work=$(mktemp -d)
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
  local j
  for j in $(jobs -p); do kill "$j" 2>/dev/null; done
  # Down first: a job blocked on a mount that stopped answering ends only once its client is killed.
  "$pfs" down >"$work/down.log" 2>&1 || { echo "glusterfs.sh down failed:"; cat "$work/down.log"; }
  for j in $(jobs -p); do
    wait_bounded "$j" 10 2>/dev/null
    [ "$still_running" = 1 ] && echo "background job $j still running after glusterfs.sh down"
  done
  if [ -n "${KEEP:-}" ]; then echo "logs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
# shellcheck source=tests/cli/lib.sh
. "$here/lib.sh"
ok() { passed=$((passed + 1)); echo "ok   $1"; }
quote() { while IFS= read -r l; do printf '     | %s\n' "$l"; done; } # indents a block of output
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && quote <<<"$2" | tail -n 25; }

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP pfs.$scenario: needs root (glusterd and FUSE mounts)"
  exit 77
fi

# Brings the volume up (glusterfs.sh's arguments); exit 77 where it cannot run here, 1 if it fails.
pfs_up() {
  local out rc
  out=$("$pfs" up "$@" 2>&1)
  rc=$?
  if [ $rc -eq 77 ]; then
    echo "SKIP pfs.$scenario: $out"
    exit 77
  elif [ $rc -ne 0 ]; then
    echo "FAIL pfs.$scenario: glusterfs.sh up $* (exit $rc):"
    quote <<<"$out"
    exit 1
  fi
  echo "$out" | grep '^glusterfs:'
  eval "$("$pfs" env)"
}

# sinew-ckpt list DIR --json, as "NAME STEP STATE" lines (newest first).
listing() {
  timeout -k 5 60 "$ckpt" list "$1" --json 2>/dev/null | python3 -c '
import json, sys
for c in json.load(sys.stdin)["checkpoints"]:
    print(c["name"], c["step"], c["state"])'
}

# The resume event of a metrics file as "PATH STEP STEPS_LOST" (STEPS_LOST "-" when the field is absent).
resume_event() {
  python3 - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    if e.get("event") == "resume":
        print(e.get("path", ""), e.get("step", ""), e.get("steps_lost", "-"))
EOF
}

# wait_bounded PID S: waits up to S seconds for the background job PID and returns its exit status; sets
# still_running=1 (and returns 1) if it is still running then.
wait_bounded() {
  local t0=$SECONDS
  still_running=0
  while kill -0 "$1" 2>/dev/null; do
    if ((SECONDS - t0 >= $2)); then
      still_running=1
      return 1
    fi
    sleep 0.2
  done
  wait "$1"
}

# What the reader's processes and the mounts' clients are doing: state, kernel wait channel, kernel stacks of
# the blocked ones, and the last warnings and errors of the second mount's client log.
stuck_report() {
  local p t
  # shellcheck disable=SC2009 # every column of ps, for the processes named
  ps -eo pid,ppid,stat,etime,wchan:32,args | grep -E 'pfs_scan|sinew-ckpt|glusterfs' | grep -v grep
  for p in $(pgrep -f 'pfs_scan.py|sinew-ckpt'); do
    for t in /proc/"$p"/task/*; do
      [ "$(awk '{print $3}' "$t/stat" 2>/dev/null)" = D ] || continue
      echo "blocked thread ${t##*/} of $p, kernel stack:"
      head -n 12 "$t/stack" 2>/dev/null
    done
  done
  echo "client log of the second mount (warnings, errors):"
  grep -E '\] [WEC] \[' "$SINEW_PFS_DIR/log/mnt2.log" 2>/dev/null | tail -n 15
}

common=(--dataset synthetic --model mlp:16 --batch-size 16 --epochs 1000 --progress false --elastic off
  --timeout-ms 30000)

commit_scan() {
  local steps=${PFS_COMMITS:-200} d d2 scan rc src t0 out
  pfs_up
  d=$SINEW_PFS_MOUNT/commit-scan
  d2=$SINEW_PFS_MOUNT2/commit-scan
  mkdir -p "$d"
  for _ in $(seq 50); do [ -d "$d2" ] && break; sleep 0.1; done
  timeout -k 5 300 python3 "$here/pfs_scan.py" --dir "$d2" --ckpt "$ckpt" --stop-file "$work/stop" --every 1 \
    --retry 2 --deadline 280 >"$work/scan.json" 2>"$work/scan.log" &
  scan=$!
  t0=$SECONDS
  timeout -k 5 200 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --max-steps "$steps" --checkpoint-dir "$d" \
    --checkpoint-every 1 --checkpoint-keep 0 --metrics "$work/train.jsonl" >"$work/train.log" 2>&1
  rc=$?
  echo "     training with $steps checkpoints: $((SECONDS - t0)) s (exit $rc)"
  touch "$work/stop"
  # The reader ends within seconds of the stop file (a last listing, the last verifications). One blocked
  # in a file system call on the second mount cannot be killed (a FUSE request its client never answers):
  # waiting for it would outlast ctest's deadline and print nothing, as in one CI run. Say what it waits on.
  wait_bounded "$scan" 90
  src=$?
  if [ "$still_running" = 1 ]; then
    bad "the reader did not end within 90 s of the stop file (a GlusterFS client that stopped answering?)" \
      "$(stuck_report)"
    return
  fi
  local committed failed_ck
  committed=$(grep '"event":"checkpoint"' "$work/train.jsonl" 2>/dev/null | grep -vc '"error"')
  failed_ck=$(grep '"event":"checkpoint"' "$work/train.jsonl" 2>/dev/null | grep -c '"error"')
  if [ $rc -eq 0 ] && [ "$committed" -eq "$steps" ] && [ "$failed_ck" -eq 0 ]; then
    ok "the job committed $committed checkpoints"
  else
    bad "the job (exit $rc) committed $committed of $steps checkpoints, $failed_ck failed" "$(cat "$work/train.log")"
  fi

  # What the reader saw while the job ran.
  out=$(python3 - "$work/scan.json" <<'EOF'
import json, sys
try:
    s = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
except Exception as e:  # no summary: the scanner died
    print(f"no summary from pfs_scan.py ({e})")
    sys.exit(1)
print(f"reader: {s['seen_committed']} seen committed ({s['seen_by_lookup']} first by lookup), "
      f"{s['verified']} verified, {len(s['broken'])} broken, {len(s['lost'])} lost, "
      f"{len(s['listed_invalid'])} listed invalid at some point; {s['lookups']} lookups, {s['listings']} "
      f"listings in {s['seconds']} s")
for k in ("broken", "lost", "listed_invalid"):
    for name, why in sorted(s[k].items()):
        print(f"  {k}: {name}: {why}")
EOF
  )
  echo "     $out" | head -n 1
  if [ $src -eq 0 ]; then
    ok "the reader saw no checkpoint broken or lost after it was committed"
  else
    bad "the reader (exit $src: 1 broken/lost, 3 deadline)" "$out
$(tail -n 20 "$work/scan.log")"
  fi

  # Afterwards, from both mounts: every step committed and valid, and every committed one verifies.
  # Uncommitted directories (a name found taken, a failed attempt) are counted, not failed: readers never
  # take them for checkpoints.
  local m dir lst valid invalid partial steps_ok paths vout vrc
  for m in 1 2; do
    if [ $m -eq 1 ]; then dir=$d; else dir=$d2; fi
    lst=$(listing "$dir")
    valid=$(awk '$3 == "valid"' <<<"$lst" | wc -l)
    invalid=$(awk '$3 != "valid" && $3 != "partial" && $3 != "uncommitted"' <<<"$lst" | wc -l)
    partial=$(awk '$3 == "partial" || $3 == "uncommitted"' <<<"$lst" | wc -l)
    steps_ok=$(awk '$3 == "valid" {print $2}' <<<"$lst" | sort -nu | awk -v n="$steps" '$1 >= 1 && $1 <= n' | wc -l)
    mapfile -t paths < <(awk -v d="$dir" '$3 != "partial" && $3 != "uncommitted" {print d "/" $1}' <<<"$lst")
    vout=$(timeout -k 5 60 "$ckpt" verify "${paths[@]}" 2>&1)
    vrc=$?
    echo "     mount $m: $valid valid, $invalid invalid, $partial uncommitted; verify: $(grep -c ': OK' <<<"$vout") OK (exit $vrc)"
    if [ "$steps_ok" -eq "$steps" ] && [ "$invalid" -eq 0 ] && [ $vrc -eq 0 ]; then
      ok "mount $m: all $steps checkpoints committed and valid, all verify"
    else
      bad "mount $m: $steps_ok of steps 1..$steps valid, $invalid invalid, verify exit $vrc" \
        "$(grep -v ': OK' <<<"$vout" | head -n 20)
$(awk '$3 != "valid"' <<<"$lst" | head -n 20)"
    fi
  done
}

brick_loss() {
  local bricks=${PFS_BRICKS:-6} d d2 rc out lst newest nstep
  pfs_up --bricks "$bricks" --layout distribute
  d=$SINEW_PFS_MOUNT/brick-loss
  d2=$SINEW_PFS_MOUNT2/brick-loss
  timeout 300 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --max-steps 100 --checkpoint-dir "$d" \
    --checkpoint-every 10 --checkpoint-keep 0 >"$work/train.log" 2>&1
  rc=$?
  lst=$(listing "$d2")
  if [ $rc -ne 0 ] || [ "$(awk '$3 == "valid"' <<<"$lst" | wc -l)" -lt 2 ]; then
    bad "training with checkpoints (exit $rc)" "$(tail -n 20 "$work/train.log")
$lst"
    return
  fi
  newest=$(awk '$3 == "valid" {print $1; exit}' <<<"$lst")
  nstep=$(awk '$3 == "valid" {print $2; exit}' <<<"$lst")

  # Where every file of every committed checkpoint lives: "NAME STEP FILE BRICK".
  local name step f b
  : >"$work/placement"
  while read -r name step _; do
    for f in "$d/$name"/*; do
      b=$("$pfs" brick-of "$f") || { bad "brick-of $f" "$b"; return; }
      echo "$name $step ${f##*/} $b" >>"$work/placement"
    done
  done < <(awk '$3 == "valid"' <<<"$lst")
  # The brick to kill: it holds a file of the newest checkpoint (not its commit record: without that the
  # newest is simply not committed) and no file of some older one; of those, the one whose fallback is newest.
  local pick k fallback fstep missing lost
  pick=$(python3 - "$work/placement" "$newest" <<'EOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
newest = sys.argv[2]
files = {}
for name, step, f, b in rows:
    files.setdefault((int(step), name), []).append((f, int(b)))
order = sorted(files, reverse=True)
commit_brick = {b for f, b in files[order[0]] if f == "COMMITTED"}
best = None
for k in sorted({b for f, b in files[order[0]]} - commit_brick):
    for step, name in order[1:]:
        if all(b != k for f, b in files[(step, name)]):
            if best is None or step > best[2]:
                best = (k, name, step, [f for f, b in files[order[0]] if b == k])
            break
if best:
    print(best[0], best[1], best[2], ",".join(best[3]))
EOF
  )
  if [ -z "$pick" ]; then
    bad "no brick holds a file of $newest and none of an older checkpoint (try more bricks: PFS_BRICKS)" \
      "$(cat "$work/placement")"
    return
  fi
  read -r k fallback fstep missing <<<"$pick"
  lost=$((nstep - fstep))
  echo "     newest $newest; brick $k holds its ${missing//,/, } and nothing of $fallback: $lost steps to lose"

  # 1. The brick stays dead: wait 3 s, fall back, say what is missing and how many steps are lost.
  "$pfs" brick-kill "$k" 2>&1 | sed 's/^/     /'
  local t0 log=$work/resume1.log
  t0=$(date +%s.%N)
  # --checkpoint-every 0: the only write is the end checkpoint, of a step past every existing one (it fails
  # when one of its files hashes to the dead brick: exit 4, training went on).
  timeout 180 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --max-steps $((nstep + 20)) --checkpoint-dir "$d" \
    --checkpoint-every 0 --checkpoint-keep 0 --resume auto --resume-wait 3 --metrics "$work/resume1.jsonl" \
    >"$log" 2>&1
  rc=$?
  echo "     resume with brick $k dead: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s, exit $rc"
  local why=()
  { [ $rc -eq 0 ] || { [ $rc -eq 4 ] && grep -q "checkpoint failed at step" "$log"; }; } || why+=("exit $rc")
  local one=${missing%%,*}
  grep -i "missing" "$log" | grep -qF "$one" || why+=("no log line says $one is missing")
  grep -i "missing" "$log" | grep -qE "(up to|for) 3(\.0)? ?s" || why+=("no log line says it waits up to 3 s")
  grep -qF "resumed from $d/$fallback " "$log" || why+=("did not resume from $d/$fallback")
  grep -qE "(^|[^0-9])$lost steps lost|steps lost[^0-9]*$lost([^0-9]|$)" "$log" || why+=("no log line says $lost steps lost")
  read -r rpath rstep rlost <<<"$(resume_event "$work/resume1.jsonl" 2>/dev/null)"
  [ "${rpath:-}" = "$d/$fallback" ] && [ "${rstep:-}" = "$fstep" ] || why+=("resume event: '${rpath:-}' step '${rstep:-}'")
  [ "${rlost:--}" = "-" ] || [ "${rlost}" = "$lost" ] || why+=("resume event: steps_lost $rlost, expected $lost")
  grep -q '"event":"done"' "$work/resume1.jsonl" 2>/dev/null || why+=("no done event")
  if [ ${#why[@]} -eq 0 ]; then
    ok "brick $k dead: waited, fell back to $fallback, $lost steps lost, finished"
  else
    bad "brick $k dead: $(IFS=';'; echo "${why[*]}")" "$(cat "$log")"
  fi

  # Between the two: the brick back, the newest whole again, and nothing newer than it (the end checkpoint
  # of that run, or what is left of it).
  "$pfs" brick-start 2>&1 | sed 's/^/     /'
  for f in "$d"/ckpt-*; do
    step=$(sed -E 's/^ckpt-0*([0-9]+).*$/\1/' <<<"${f##*/}")
    [ "$step" -gt "$nstep" ] && rm -rf "$f"
  done
  out=$(timeout 60 "$ckpt" verify "$d2/$newest" 2>&1) || { bad "$newest after brick-start" "$out"; return; }

  # 2. The brick comes back while the resume waits: it takes the newest and says the files reappeared.
  "$pfs" brick-kill "$k" 2>&1 | sed 's/^/     /'
  log=$work/resume2.log
  t0=$(date +%s.%N)
  timeout 180 "${mpiexec[@]}" -n 2 "$train" "${common[@]}" --max-steps $((nstep + 20)) --checkpoint-dir "$d" \
    --checkpoint-every 0 --checkpoint-keep 0 --resume auto --resume-wait 20 --metrics "$work/resume2.jsonl" \
    >"$log" 2>&1 &
  local job=$!
  # Start the brick once the resume waits for it (at most ~8 s after the launch; then anyway).
  for _ in $(seq 80); do grep -qi "missing" "$log" && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
  sleep 2
  "$pfs" brick-start 2>&1 | sed 's/^/     /'
  wait $job
  rc=$?
  echo "     resume with brick $k back after ~2 s: $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s, exit $rc"
  why=()
  [ $rc -eq 0 ] || why+=("exit $rc")
  grep -i "missing" "$log" | grep -qF "$one" || why+=("no log line says $one is missing")
  grep -qi "reappeared" "$log" || why+=("no log line says the files reappeared")
  grep -qF "resumed from $d/$newest " "$log" || why+=("did not resume from $d/$newest")
  ! grep -q "steps lost" "$log" || why+=("says steps were lost")
  read -r rpath rstep rlost <<<"$(resume_event "$work/resume2.jsonl" 2>/dev/null)"
  [ "${rpath:-}" = "$d/$newest" ] || why+=("resume event: '${rpath:-}'")
  [ "${rlost:--}" = "-" ] || [ "$rlost" = 0 ] || why+=("resume event: steps_lost $rlost")
  grep -q '"event":"done"' "$work/resume2.jsonl" 2>/dev/null || why+=("no done event")
  if [ ${#why[@]} -eq 0 ]; then
    ok "brick $k back while the resume waited: resumed from the newest, $newest"
  else
    bad "brick $k back while the resume waited: $(IFS=';'; echo "${why[*]}")" "$(cat "$log")"
  fi
}

case $scenario in
  commit-scan) commit_scan ;;
  brick-loss) brick_loss ;;
  *) echo "usage: pfs_checkpoints.sh commit-scan|brick-loss SINEW_TRAIN SINEW_CKPT MPIEXEC [FLAGS...]" >&2; exit 2 ;;
esac
finish
