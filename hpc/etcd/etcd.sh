#!/usr/bin/env bash
# A private etcd on this machine, for the registry of distillation (teachers register in it, students watch
# it) and its tests: one member, listening on 127.0.0.1 only. Everything lives in one folder D (default
# $SINEW_ETCD_DIR, else /tmp/sinew-etcd): the data (D/data), the log (D/etcd.log), the pid (D/pid) and
# the endpoint (D/env, one line SINEW_ETCD=http://127.0.0.1:P).
#
# Usage: etcd.sh up [--dir D] [--port P]   start etcd with client port P (default: the first port from 23790
#                                          up whose P and P+1 are free) and peer port P+1, wait until it is
#                                          healthy (at most 10 s), print the endpoint. Idempotent: an etcd
#                                          of D that runs is left alone (its endpoint is printed).
#        etcd.sh down [--dir D]            stop it (SIGTERM, SIGKILL after 5 s), remove its data, pid and
#                                          env (the log stays); safe when nothing runs
#        etcd.sh env [--dir D]             print D/env: eval "export $(etcd.sh env)"
#        etcd.sh status [--dir D]          up (and the endpoint) or down; exit 1 if not up and healthy
# Exit code 77 when etcd is not installed (tests show as skipped); 1 on other failures, with what to do; 2
# on bad usage. Every wait is bounded. Here `up` takes ~0.5 s, `down` ~1.5 s (etcd's graceful stop).
set -euo pipefail

usage() { sed -n '7,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
say() { echo "etcd.sh: $*" >&2; }
die() { echo "etcd.sh: error: $*" >&2; exit 1; }
unavailable() { echo "etcd.sh: unavailable here: $*" >&2; exit 77; }

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
dir=${SINEW_ETCD_DIR:-/tmp/sinew-etcd}
port=
while [[ $# -gt 0 ]]; do
  case $1 in
    --dir) [[ $# -ge 2 ]] || usage; dir=$2; shift 2 ;;
    --port) [[ $# -ge 2 ]] || usage; port=$2; shift 2 ;;
    *) say "unknown argument '$1'"; usage ;;
  esac
done
# Checked before anything is removed under it.
[[ $dir == /* && $dir != / && $dir =~ ^[A-Za-z0-9._/-]+$ ]] ||
  die "the folder must be an absolute path of letters, digits and ._-/ (not /), got '$dir'"
dir=${dir%/}
if [[ -n $port ]]; then
  if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1024 || port > 65534)); then
    die "--port must be a number in 1024..65534 (the peer port is P+1), got '$port'"
  fi
fi

alive() { # PID exists and is not a zombie
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $s != Z* ]]
}

# The pid of D's etcd if it runs: the pid file names a live process whose command line holds our data
# folder (not a process that reused the pid).
running() {
  local pid
  [[ -f $dir/pid ]] || return 1
  pid=$(<"$dir/pid")
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--data-dir $dir/data " || return 1
  echo "$pid"
}

healthy() { # URL
  local out
  out=$(curl -s --noproxy '*' --max-time 1 "$1/health" 2>/dev/null) && [[ $out == *'"health":"true"'* ]]
}

# Whether something listens on 127.0.0.1:PORT (bash's /dev/tcp: no ss or netstat needed).
listening() { timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

endpoint_of() {
  [[ -f $dir/env ]] || return 0
  sed -n 's/^SINEW_ETCD=//p' "$dir/env"
}

# Starts etcd on PORT, PORT+1; 0 once healthy, 3 if it lost a race for a port, dies otherwise.
start() {
  local p=$1 url pid deadline
  url=http://127.0.0.1:$p
  rm -rf "$dir/data"
  # All descriptors to the log: a caller that reads our output (ctest, $(...)) must not wait for etcd.
  etcd --name n0 --data-dir "$dir/data" \
    --listen-client-urls "$url" --advertise-client-urls "$url" \
    --listen-peer-urls "http://127.0.0.1:$((p + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((p + 1))" \
    --initial-cluster "n0=http://127.0.0.1:$((p + 1))" --initial-cluster-state new \
    </dev/null >>"$dir/etcd.log" 2>&1 &
  pid=$!
  disown "$pid"
  echo "$pid" >"$dir/pid"
  deadline=$((SECONDS + 10))
  until healthy "$url"; do
    if ! alive "$pid"; then
      rm -f "$dir/pid"
      if grep -q "address already in use" "$dir/etcd.log"; then return 3; fi
      tail -n 20 "$dir/etcd.log" >&2
      die "etcd exited at start (log above, in $dir/etcd.log)"
    fi
    if ((SECONDS >= deadline)); then
      kill -KILL "$pid" 2>/dev/null || true
      rm -f "$dir/pid"
      tail -n 20 "$dir/etcd.log" >&2
      die "etcd on $url not healthy within 10 s (log above, in $dir/etcd.log)"
    fi
    sleep 0.1
  done
  echo "SINEW_ETCD=$url" >"$dir/env"
  echo "$url"
}

up() {
  command -v etcd >/dev/null || unavailable "'etcd' not found: install etcd-server (Debian, Ubuntu) or etcd"
  command -v curl >/dev/null || unavailable "'curl' not found (needed to see that etcd is healthy): install curl"
  mkdir -p "$dir"
  if running >/dev/null; then
    local url
    url=$(endpoint_of)
    if [[ -n $url ]] && healthy "$url"; then
      say "already up"
      echo "$url"
      return 0
    fi
    die "an etcd of $dir runs (pid $(<"$dir/pid")) but is not healthy: run 'etcd.sh down --dir $dir' first"
  fi
  rm -f "$dir/env" "$dir/pid"
  : >"$dir/etcd.log"
  if [[ -n $port ]]; then
    if listening "$port" || listening $((port + 1)); then
      die "port $port or $((port + 1)) of 127.0.0.1 is taken: pick another --port, or none"
    fi
    start "$port" || die "port $port or $((port + 1)) was taken while etcd started: pick another --port"
    return 0
  fi
  # Scan for two free ports; a port taken between the check and etcd's bind (another etcd.sh, say)
  # makes etcd exit, and the scan goes on.
  local p=23790 rc
  while ((p < 23790 + 200)); do
    if ! listening "$p" && ! listening $((p + 1)); then
      rc=0
      start "$p" || rc=$?
      ((rc == 0)) && return 0
      : >"$dir/etcd.log"
    fi
    p=$((p + 2))
  done
  die "no two free ports in 23790..23989 of 127.0.0.1: pass --port"
}

down() {
  local pid deadline
  if pid=$(running); then
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
    if alive "$pid"; then
      say "etcd (pid $pid) did not stop within 5 s of SIGTERM: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 5))
      while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
      alive "$pid" && die "etcd (pid $pid) survived SIGKILL for 5 s"
    fi
  fi
  rm -rf "$dir/data"
  rm -f "$dir/pid" "$dir/env"
}

case $cmd in
  up) up ;;
  down) down ;;
  env)
    [[ -f $dir/env ]] || die "no etcd is up in $dir: run 'etcd.sh up --dir $dir'"
    cat "$dir/env"
    ;;
  status)
    url=$(endpoint_of)
    if running >/dev/null && [[ -n $url ]] && healthy "$url"; then
      echo "up $url"
    else
      echo "down"
      exit 1
    fi
    ;;
  -h | --help | help) usage ;;
  *) say "unknown command '$cmd'"; usage ;;
esac
