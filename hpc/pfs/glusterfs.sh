#!/usr/bin/env bash
# A real parallel file system on one machine, for the checkpoint tests and benchmarks (issue 14): a private
# glusterd (GlusterFS 10), N bricks and volume "sinew", mounted twice. Every file lives in one folder
# ($SINEW_PFS_DIR, default /tmp/sinew-pfs): glusterd's configuration, state, sockets, pid files and logs, the
# bricks, and the mount points mnt (for writers) and mnt2 (a second FUSE client, for readers and scanners: it
# sees the writers' files through its own caches and lookups, as another node of a cluster would).
#
# Usage: glusterfs.sh up [--bricks N] [--layout distribute|replicate|disperse]
#                                    start glusterd, create the volume, mount it twice; prints the mount
#                                    points. Default: distribute over 4 bricks (a whole file on one brick,
#                                    chosen by a hash of its name). replicate: replica 3, disperse: 3 bricks
#                                    with redundancy 1; N a multiple of 3 (default 3). Idempotent: a healthy
#                                    volume of that shape is left alone, any other one replaced.
#        glusterfs.sh down           unmount, stop our daemons, remove the folder and what glusterd wrote
#                                    outside it (safe when nothing runs)
#        glusterfs.sh status         up or down, bricks online, mounts; exit 1 if not up
#        glusterfs.sh env            the mount points, for eval: SINEW_PFS_MOUNT (mnt), SINEW_PFS_MOUNT2 (mnt2)
#        glusterfs.sh brick-kill K   SIGKILL brick K's process (K = 1..N): its files read as missing (ENOENT)
#                                    and new files hashed to it fail (ENOTCONN), on both mounts
#        glusterfs.sh brick-start    start the killed bricks again; returns once both mounts reach them
#        glusterfs.sh brick-of FILE  the index of the brick that holds FILE (a path in either mount); of
#                                    all the bricks that hold it, on one line, for replicate and disperse
# Needs root (glusterd, FUSE mounts). Exit code 77 when this machine cannot run a FUSE file system or has no
# GlusterFS (tests show as skipped); 1 on other failures, with what to do; 2 on bad usage. Every wait is
# bounded. Here `up` takes ~3 s (8 s while the 2 cores compile), `down` ~2-6 s (removing the bricks' files).
# The measured behaviours behind the settings are explained next to them below.
set -euo pipefail
if [[ -n ${SINEW_PFS_TRACE:-} ]]; then # every command, with a timestamp (where the seconds go)
  PS4='+ ${EPOCHREALTIME} '
  set -x
fi
dir=${SINEW_PFS_DIR:-/tmp/sinew-pfs}
vol=sinew
sock=$dir/run/glusterd.socket # private: we never talk to (or through) a system glusterd's /var/run/glusterd.socket
marker=$dir/.sinew-pfs        # "N LAYOUT"; a folder without it is never removed
probes=.sinew-pfs-probe       # at the volume's root: a file on each brick, to see that a client reaches it
# Paths glusterd 10 writes outside its configured directories (hard-coded in it). `up` notes which of them
# did not exist before; `down` removes only those, and only when empty. Deepest first.
outside=(/var/lib/glusterd/geo-replication/gsyncd_template.conf /var/lib/glusterd/geo-replication
  /var/lib/glusterd/ss_brick /var/lib/glusterd /var/run/gluster/snaps /var/run/gluster /var/log/glusterfs)

usage() { sed -n '8,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { echo "glusterfs: $*" >&2; }
die() { echo "glusterfs: error: $*" >&2; exit 1; }
unavailable() { echo "glusterfs: unavailable here: $*" >&2; exit 77; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }

[[ $dir == /* && $dir != / && $dir =~ ^[A-Za-z0-9._/-]+$ ]] ||
  die "SINEW_PFS_DIR must be an absolute path of letters, digits and ._-/ (not /), got '$dir'"
dir=${dir%/}
mnt=$dir/mnt
mnt2=$dir/mnt2

need() {
  [[ $(id -u) -eq 0 ]] || die "needs root (glusterd and FUSE mounts)"
  local p
  for p in glusterd gluster glusterfs glusterfsd mount.glusterfs getfattr; do
    command -v "$p" >/dev/null ||
      unavailable "'$p' not found: install glusterfs-server, glusterfs-client and attr (mpi_scripts/setup.sh does)"
  done
  [[ -c /dev/fuse ]] ||
    unavailable "no /dev/fuse (modprobe fuse; in a container: --device /dev/fuse --cap-add SYS_ADMIN)"
  # glusterd refuses bricks on 127.0.0.1 or localhost ("not a local address" / "not a valid brick host"),
  # but takes the machine's own name when that resolves to a local address.
  host=$(hostname)
  getent hosts "$host" >/dev/null ||
    die "this machine's name '$host' does not resolve: add '127.0.0.1 $host' to /etc/hosts (glusterd refuses bricks on localhost and 127.0.0.1)"
}

# The gluster command-line client, bounded, talking to our glusterd only, logging into our folder.
gl() { timeout "${gl_timeout:-30}" gluster --glusterd-sock="$sock" --mode=script --log-file="$dir/log/cli.log" "$@"; }

alive() { # PID exists and is not a zombie
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $s != Z* ]]
}

# Our processes, one PID a line: glusterd, the bricks (glusterfsd), the FUSE clients and any helper glusterd
# starts (glusterfs), recognised by their command lines, which all name a path in our folder. A foreign
# glusterd's never do. (Builtins only: this runs over every process of the machine.)
ours() {
  local p comm line
  local -a args
  for p in /proc/[0-9]*; do
    read -r comm 2>/dev/null <"$p/comm" || continue
    [[ $comm == glusterd || $comm == glusterfs || $comm == glusterfsd ]] || continue
    mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
    line=" ${args[*]}"
    if [[ $line == *" $dir/"* || $line == *"=$dir/"* ]]; then echo "${p#/proc/}"; fi
  done
  return 0
}

brick_pid() { # the PID of brick K's glusterfsd (nothing if none runs)
  local want=$dir/bricks/b$1 p i comm args
  for p in /proc/[0-9]*; do
    read -r comm 2>/dev/null <"$p/comm" || continue
    [[ $comm == glusterfsd ]] || continue
    mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
    for ((i = 0; i + 1 < ${#args[@]}; i++)); do
      if [[ ${args[i]} == --brick-name && ${args[i + 1]} == "$want" ]] && alive "${p#/proc/}"; then
        echo "${p#/proc/}"
        return 0
      fi
    done
  done
  return 0
}

note_sockets() { # our processes' unix sockets in /var/run/gluster (-S PATH: glusterd puts them there, always)
  local p i args
  for p in $(ours); do
    mapfile -d '' -t args 2>/dev/null <"/proc/$p/cmdline" || continue
    for ((i = 0; i + 1 < ${#args[@]}; i++)); do
      if [[ ${args[i]} == -S ]]; then echo "${args[i + 1]}" >>"$dir/sockets"; fi
    done
  done
  return 0
}

is_mounted() { awk -v m="$1" '$2 == m {f = 1} END {exit !f}' /proc/self/mounts; }

shape() { if [[ -f $marker ]]; then cat "$marker"; fi; } # "N LAYOUT" of the volume in the folder
nbricks() { local s; s=$(shape); echo "${s%% *}"; }

# "K ONLINE PID" for each brick in `volume status` (ONLINE 1 or 0), read from its XML: the text output wraps
# long brick names onto a line of their own.
brick_states() {
  gl_timeout=10 gl volume status "$vol" --xml 2>/dev/null | awk -v pre="$dir/bricks/b" '
    /<node>/ { path = ""; st = ""; pid = "" }
    /<path>/ { gsub(/.*<path>|<\/path>.*/, ""); path = $0 }
    /<status>/ { gsub(/.*<status>|<\/status>.*/, ""); st = $0 }
    /<pid>/ { gsub(/.*<pid>|<\/pid>.*/, ""); pid = $0 }
    /<\/node>/ && index(path, pre) == 1 { print substr(path, length(pre) + 1), st, pid }'
}
bricks_online() { brick_states | awk '$2 == 1' | wc -l; }

# Both mounts reach every brick: each stats a probe file that lives on that brick (for distribute, a
# lookup of a file whose brick is gone answers ENOENT, so the wait ends once both clients reconnected; a
# client retries a brick every ~3 s). WAIT seconds at most.
clients_reach_bricks() {
  local wait=$1 t0=$SECONDS f m ok
  [[ -s $dir/probes ]] || return 1
  while :; do
    ok=1
    while read -r f; do
      for m in "$mnt" "$mnt2"; do timeout 5 stat -- "$m/$f" >/dev/null 2>&1 || ok=0; done
    done <"$dir/probes"
    ((ok)) && return 0
    ((SECONDS - t0 < wait)) || return 1
    sleep 0.2
  done
}

# Creates the probe files: names p0, p1, ... (a name's hash picks its brick) until every brick holds one.
make_probes() {
  local n=$1 i k covered=0 new
  local -a got=()
  timeout 10 mkdir -p "$mnt/$probes" || return 1
  : >"$dir/probes"
  for ((i = 0; i < 64 * n && covered < n; i++)); do
    timeout 5 touch "$mnt/$probes/p$i" 2>/dev/null || continue
    new=0
    for ((k = 1; k <= n; k++)); do
      if [[ -z ${got[k]:-} && -e $dir/bricks/b$k/$probes/p$i ]]; then
        got[k]=1 covered=$((covered + 1)) new=1
      fi
    done
    if ((new)); then echo "$probes/p$i" >>"$dir/probes"; fi
  done
  ((covered == n))
}

# Kills our processes (TERM, then KILL after 5 s), unmounts, and removes what glusterd wrote outside the
# folder. Keeps the folder (its logs). Safe when nothing runs.
stop_processes() {
  local m p t0 f pids
  for m in "$mnt" "$mnt2"; do
    is_mounted "$m" || continue
    # A plain umount waits for the client; one stuck on a dead brick is detached (its process is killed below).
    timeout 15 umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "could not unmount $m"
  done
  if [[ -d $dir ]]; then note_sockets; fi
  # No `volume stop`/`delete`: the volume's whole definition lives in our folder, removed after this, and the
  # bricks shut down cleanly on SIGTERM (stop + delete took ~4 s more).
  pids=$(ours)
  if [[ -n $pids ]]; then
    # shellcheck disable=SC2086 # one PID a word
    kill -TERM $pids 2>/dev/null || true
    t0=$SECONDS
    for p in $pids; do
      while alive "$p" && ((SECONDS - t0 < 5)); do sleep 0.1; done
      if alive "$p"; then
        say "process $p did not stop on SIGTERM: SIGKILL"
        kill -KILL "$p" 2>/dev/null || true
      fi
    done
  fi
  if [[ -f $dir/sockets ]]; then
    while read -r f; do
      if [[ ($f == /var/run/gluster/* || $f == /run/gluster/*) && -S $f ]]; then rm -f -- "$f"; fi
    done < <(sort -u "$dir/sockets")
  fi
  if [[ -f $dir/outside ]]; then
    for f in "${outside[@]}"; do
      grep -qxF -- "$f" "$dir/outside" || continue
      if [[ -d $f ]]; then
        rmdir -- "$f" 2>/dev/null || say "left $f (not empty)"
      elif [[ -f $f && ! -s $f ]]; then
        rm -f -- "$f"
      fi
    done
  fi
  return 0
}

# Everything: the processes, then the folder (only ours: it has the marker, and nothing is mounted in it).
stop() {
  stop_processes
  [[ -e $dir ]] || return 0
  if [[ ! -f $marker ]] && [[ -n $(ls -A "$dir" 2>/dev/null) ]]; then
    die "$dir exists but was not made by this script (no $marker): not removing it"
  fi
  if awk -v d="$dir/" 'index($2, d) == 1 {f = 1} END {exit !f}' /proc/self/mounts; then
    die "something is still mounted in $dir (see: mount | grep $dir): not removing it"
  fi
  rm -rf --one-file-system -- "$dir"
}

healthy() { # the volume in the folder runs with shape "N LAYOUT" and both mounts reach every brick
  [[ $(shape) == "$1 $2" && -f $dir/run/glusterd.pid ]] || return 1
  local p
  p=$(cat "$dir/run/glusterd.pid" 2>/dev/null) || return 1
  alive "$p" && grep -qF "$dir/" "/proc/$p/cmdline" 2>/dev/null || return 1
  is_mounted "$mnt" && is_mounted "$mnt2" || return 1
  [[ $(bricks_online) -eq $1 ]] || return 1
  clients_reach_bricks 0
}

# glusterd runs the geo-replication helper gsyncd (Python, 0.35 s a run here) 15 times as it starts, to write
# defaults: 5.5 of the 6 s it took to start. No geo-replication here: glusterd (and the bricks it starts) run
# in a mount namespace of their own where a stand-in takes gsyncd's place (0.5 s). The namespace is a slave
# of the machine's (mounts and unmounts still reach it), and nothing changes outside it.
start_glusterd() {
  local f gsyncd=''
  local -a run=(glusterd -f "$dir/glusterd.vol" -p "$dir/run/glusterd.pid" -l "$dir/log/glusterd.log")
  for f in /usr/lib/x86_64-linux-gnu/glusterfs/gsyncd /usr/libexec/glusterfs/gsyncd /usr/lib/glusterfs/gsyncd; do
    if [[ -x $f ]]; then gsyncd=$f; break; fi
  done
  if [[ -n $gsyncd ]] && unshare -m --propagation slave true 2>/dev/null; then
    cat >"$dir/gsyncd" <<'EOF'
#!/bin/sh
# A stand-in for gsyncd in the mount namespace of hpc/pfs/glusterfs.sh's glusterd: no geo-replication.
[ "$1" = --version ] && echo "gsyncd.py (stand-in)"
exit 0
EOF
    chmod +x "$dir/gsyncd"
    # shellcheck disable=SC2016 # expanded by that sh
    run=(unshare -m --propagation slave sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' sh "$dir/gsyncd" "$gsyncd"
      "${run[@]}")
  fi
  # glusterd daemonizes (stdio to /dev/null); fd 9, the lock of this script, must not live on in it.
  "${run[@]}" </dev/null >"$dir/log/glusterd.out" 2>&1 9<&-
}

start() {
  local n=$1 layout=$2 k f t0 m
  local -a layout_args bricks
  case $layout in
    distribute) layout_args=() ;;
    replicate) layout_args=(replica 3) ;;
    disperse) layout_args=(disperse 3 redundancy 1) ;;
  esac
  mkdir -p "$dir"/{wd,run,log,mnt,mnt2,bricks}
  echo "$n $layout" >"$marker"
  : >"$dir/outside"
  for f in "${outside[@]}"; do [[ -e $f ]] || echo "$f" >>"$dir/outside"; done
  # glusterd's bricks always find it on TCP 24007 (`-s HOST`, no port; a glusterd on another port fails every
  # brick start), so a second glusterd on this machine cannot work.
  if ss -Hltn 'sport = :24007' 2>/dev/null | grep -q .; then
    unavailable "TCP port 24007 is taken (a system glusterd? systemctl stop glusterd): this one needs it for its bricks"
  fi
  # The Debian defaults (/etc/glusterfs/glusterd.vol) with every path in our folder. run-directory and
  # logging-directory take the brick pid files and logs; glusterd-sockfile keeps the CLI off the system's.
  cat >"$dir/glusterd.vol" <<EOF
# Written by hpc/pfs/glusterfs.sh.
volume management
    type mgmt/glusterd
    option working-directory $dir/wd
    option run-directory $dir/run
    option logging-directory $dir/log
    option glusterd-sockfile $sock
    option transport-type socket
    option transport.socket.keepalive-time 10
    option transport.socket.keepalive-interval 2
    option transport.socket.read-fail-log off
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
    option max-port 60999
end-volume
EOF
  start_glusterd ||
    die "glusterd did not start: $(tail -n 5 "$dir/log/glusterd.out" "$dir/log/glusterd.log" 2>/dev/null)"
  t0=$SECONDS
  until gl_timeout=5 gl peer status >/dev/null 2>&1; do
    ((SECONDS - t0 < 20)) || die "glusterd does not answer after 20 s (log: $dir/log/glusterd.log)"
    sleep 0.1
  done
  for ((k = 1; k <= n; k++)); do
    mkdir -p "$dir/bricks/b$k"
    bricks+=("$host:$dir/bricks/b$k")
  done
  # force: the bricks are on the root file system (refused without it).
  gl volume create "$vol" "${layout_args[@]}" "${bricks[@]}" force >/dev/null ||
    die "volume create failed (log: $dir/log/glusterd.log)"
  # Set before any client mounts (a client takes it at mount): how long a client waits on a brick that
  # stopped answering before it reports it gone. The default, 42 s, stalls every reader that long.
  gl volume set "$vol" network.ping-timeout 5 >/dev/null || die "volume set network.ping-timeout failed"
  gl volume start "$vol" >/dev/null || die "volume start failed (logs: $dir/log/glusterd.log, $dir/log/bricks)"
  t0=$SECONDS
  until [[ $(bricks_online) -eq $n ]]; do
    ((SECONDS - t0 < 20)) || die "only $(bricks_online) of $n bricks online after 20 s (logs: $dir/log/bricks)"
    sleep 0.2
  done
  # Both at once (a mount takes ~1 s).
  local -A mount_pid
  for m in mnt mnt2; do
    timeout 30 mount -t glusterfs -o "log-file=$dir/log/$m.log" "$host:/$vol" "$dir/$m" \
      </dev/null >"$dir/log/$m.out" 2>&1 9<&- &
    mount_pid[$m]=$!
  done
  for m in mnt mnt2; do
    wait "${mount_pid[$m]}" && continue
    if grep -qiE 'fuse.*(denied|not permitted|no such device|failed to open|cannot open)|/dev/fuse' \
      "$dir/log/$m.out" "$dir/log/$m.log" 2>/dev/null; then
      stop_processes
      unavailable "the FUSE mount failed: $(grep -ihE 'fuse' "$dir/log/$m.out" "$dir/log/$m.log" | tail -n 2)"
    fi
    die "mounting $host:/$vol on $dir/$m failed: $(tail -n 3 "$dir/log/$m.out" "$dir/log/$m.log" 2>/dev/null)"
  done
  note_sockets
  # A mount returns before its client has connected to every brick (files hashed to one it has not
  # reached yet fail with ENOTCONN): the probes are retried for up to 20 s.
  local try
  for ((try = 1; ; try++)); do
    make_probes "$n" && break
    ((try < 20)) || die "could not place a probe file on each of the $n bricks (log: $dir/log/mnt.log)"
    sleep 1
  done
  clients_reach_bricks 20 || die "the mounts do not reach every brick after 20 s (logs: $dir/log/mnt*.log)"
}

status() {
  local s p m
  s=$(shape)
  p=$(cat "$dir/run/glusterd.pid" 2>/dev/null || true)
  if [[ -z $s || -z $p ]] || ! alive "$p"; then
    if [[ -d $dir ]]; then echo "glusterfs: down (folder $dir left: glusterfs.sh down removes it)"; else echo "glusterfs: down"; fi
    return 1
  fi
  echo "glusterfs: up: volume $vol, ${s#* } over ${s%% *} bricks, glusterd pid $p, folder $dir"
  brick_states | sort -n | awk -v pre="$dir/bricks/b" '{
    printf "  brick %d  %s%d  %s\n", $1, pre, $1, ($2 == 1 ? "online, pid " $3 : "OFFLINE") }'
  for m in "$mnt" "$mnt2"; do
    if is_mounted "$m"; then echo "  mounted  $m"; else echo "  NOT MOUNTED  $m"; fi
  done
  is_mounted "$mnt" && is_mounted "$mnt2"
}

brick_of() {
  local f=$1 abs rel k n info out=()
  n=$(nbricks)
  [[ -n $n ]] || die "the volume is not up"
  abs=$(realpath -m -s -- "$f")
  case $abs in
    "$mnt"/*) rel=${abs#"$mnt"/} ;;
    "$mnt2"/*) rel=${abs#"$mnt2"/} ;;
    *) die "$f is not in $mnt or $mnt2" ;;
  esac
  # The volume's own answer: "(<DISTRIBUTE:sinew-dht> <POSIX(DIR/bricks/b2):HOST:DIR/bricks/b2/FILE>)".
  info=$(timeout 10 getfattr --absolute-names --only-values -n trusted.glusterfs.pathinfo -- "$abs" 2>/dev/null | tr -d '\0' || true)
  for k in $(grep -oE "POSIX\\($dir/bricks/b[0-9]+\\)" <<<"$info" | grep -oE '[0-9]+\)$' | tr -d ')' | sort -nu); do
    out+=("$k")
  done
  if ((${#out[@]} == 0)); then
    # The brick is gone (the file reads as missing through the volume): look in the brick folders, skipping
    # DHT link files (empty, mode 1000: a pointer to the brick that holds the data).
    for ((k = 1; k <= n; k++)); do
      local p=$dir/bricks/b$k/$rel
      [[ -e $p ]] || continue
      [[ -f $p && ! -s $p && $(stat -c %a "$p") == 1000 ]] && continue
      out+=("$k")
    done
  fi
  ((${#out[@]} > 0)) || die "$f is on no brick"
  echo "${out[*]}"
}

brick_kill() {
  local k=$1 n p t0
  n=$(nbricks)
  [[ -n $n ]] || die "the volume is not up"
  if ! [[ $k =~ ^[0-9]+$ ]] || ((k < 1 || k > n)); then die "K must be 1..$n, got '$k'"; fi
  p=$(brick_pid "$k")
  [[ -n $p ]] || die "brick $k is not running (glusterfs.sh brick-start starts it)"
  note_sockets
  kill -KILL "$p"
  t0=$SECONDS
  while alive "$p"; do
    ((SECONDS - t0 < 10)) || die "brick $k (pid $p) still runs 10 s after SIGKILL"
    sleep 0.05
  done
  # Until its zombie is reaped (by init, here within seconds), glusterd takes the brick for running: a
  # `volume start force` then "discovered already-running brick" and started nothing.
  while [[ -e /proc/$p ]] && ((SECONDS - t0 < 15)); do sleep 0.1; done
  # Until glusterd has seen the brick go, a `volume start force` takes it for running too.
  until [[ $(bricks_online) -lt $n ]]; do
    ((SECONDS - t0 < 10)) || die "glusterd still reports brick $k online 10 s after it was killed"
    sleep 0.1
  done
  say "brick $k (pid $p, $dir/bricks/b$k) killed: its files read as missing, new files hashed to it fail"
}

brick_start() {
  local n t0 t1 try
  n=$(nbricks)
  [[ -n $n ]] || die "the volume is not up"
  t0=$(date +%s.%N)
  for try in 1 2 3; do
    gl volume start "$vol" force >/dev/null || die "volume start force failed (log: $dir/log/glusterd.log)"
    t1=$SECONDS
    while [[ $(bricks_online) -lt $n ]] && ((SECONDS - t1 < 5)); do sleep 0.2; done
    [[ $(bricks_online) -eq $n ]] && break
    # glusterd "discovered already-running brick" and started nothing (a brick's pid still in /proc).
    say "bricks not all online after 5 s (attempt $try): starting again"
  done
  [[ $(bricks_online) -eq $n ]] || die "only $(bricks_online) of $n bricks online (logs: $dir/log/bricks)"
  note_sockets
  clients_reach_bricks 30 || die "the mounts do not reach every brick 30 s after they started (logs: $dir/log/mnt*.log)"
  say "all $n bricks online and reached by both mounts after $(elapsed "$t0") s"
}

lock() { # one state-changing command at a time (daemons start with this fd closed)
  exec 9<"$0"
  flock -w 180 9 || die "another glusterfs.sh has been running for 180 s"
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  up)
    n='' layout=distribute
    while [[ $# -gt 0 ]]; do
      case $1 in
        --bricks) [[ $# -ge 2 ]] || usage; n=$2; shift 2 ;;
        --layout) [[ $# -ge 2 ]] || usage; layout=$2; shift 2 ;;
        *) usage ;;
      esac
    done
    case $layout in
      distribute) n=${n:-4} ;;
      replicate | disperse) n=${n:-3} ;;
      *) die "--layout must be distribute, replicate or disperse, got '$layout'" ;;
    esac
    if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 32)); then die "--bricks must be 1..32, got '$n'"; fi
    [[ $layout == distribute ]] || ((n % 3 == 0)) || die "--layout $layout needs a multiple of 3 bricks, got $n"
    need
    lock
    if healthy "$n" "$layout"; then
      say "up already: $layout over $n bricks; writers: $mnt, readers: $mnt2"
    else
      t0=$(date +%s.%N)
      stop
      trap 'rc=$?; if ((rc != 0 && rc != 77)); then stop_processes; say "logs kept in $dir/log (glusterfs.sh down removes them)"; fi' EXIT
      start "$n" "$layout"
      trap - EXIT
      say "up: $layout over $n bricks in $(elapsed "$t0") s; writers: $mnt, readers: $mnt2"
    fi
    echo "$mnt"
    echo "$mnt2"
    ;;
  down)
    [[ $(id -u) -eq 0 ]] || die "needs root"
    lock
    t0=$(date +%s.%N)
    was=$([[ -d $dir || -n $(ours) ]] && echo 1 || echo 0)
    stop
    if ((was)); then say "down in $(elapsed "$t0") s"; else say "nothing was up"; fi
    ;;
  status) status ;;
  env)
    echo "export SINEW_PFS_MOUNT=$mnt SINEW_PFS_MOUNT2=$mnt2"
    ;;
  brick-kill)
    [[ $# -eq 1 ]] || usage
    need
    lock
    brick_kill "$1"
    ;;
  brick-start)
    need
    lock
    brick_start
    ;;
  brick-of)
    [[ $# -eq 1 ]] || usage
    brick_of "$1"
    ;;
  *) usage ;;
esac
