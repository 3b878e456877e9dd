#!/usr/bin/env bash
# A stand-in for `sinew-teacher serve` in the autoscaler's test (autoscaler_test.cpp): a real process that
# registers itself the way a teacher does (/sinew/<job>/teachers/<id> under a lease, with its pid and a
# measured samples_per_s), refreshes the lease, and revokes it on SIGTERM or SIGINT as a clean exit does.
# It talks to etcd's JSON gateway with curl. It also exits when its parent (the autoscaler) is gone, so
# that a killed test leaves no teacher behind.
#
# Usage: autoscale_fake_teacher.sh ENDPOINT JOB SAMPLES_PER_S
#   SAMPLES_PER_S "shared:R": the teachers share one core's R samples/s, as teachers pinned to the same
#   core do: each publishes R / (teachers registered), updated every half second.
set -euo pipefail

[[ $# -eq 3 ]] || { echo "usage: autoscale_fake_teacher.sh ENDPOINT JOB SAMPLES_PER_S" >&2; exit 2; }
endpoint=$1 job=$2 rate=$3
parent=$PPID

b64() { printf '%s' "$1" | base64 -w0; }
post() { curl -sf --noproxy '*' --max-time 2 -X POST -d "$2" "$endpoint$1"; }

lease=$(post /v3/lease/grant '{"TTL": 3}' | sed -n 's/.*"ID":"\([0-9]*\)".*/\1/p')
[[ -n $lease ]] || { echo "fake teacher $$: etcd at $endpoint granted no lease" >&2; exit 1; }
key=/sinew/$job/teachers/fake-$$
shared=
if [[ $rate == shared:* ]]; then
  shared=${rate#shared:}
  rate=$shared
fi
publish() {
  local value
  value=$(printf '{"id":"fake-%d","address":"127.0.0.1:9","model":"fake","classes":10,"dataset":"fake","samples_per_s":%s,"pid":%d,"step":0}' \
    $$ "$1" $$)
  post /v3/kv/put "{\"key\":\"$(b64 "$key")\",\"value\":\"$(b64 "$value")\",\"lease\":\"$lease\"}" >/dev/null
}
# The teachers registered now (a range over the prefix, counted).
teachers() {
  local prefix=/sinew/$job/teachers/ end
  end=${prefix%/}0  # '/' + 1 = '0': every key under the prefix
  post /v3/kv/range "{\"key\":\"$(b64 "$prefix")\",\"range_end\":\"$(b64 "$end")\",\"count_only\":true}" |
    sed -n 's/.*"count":"\([0-9]*\)".*/\1/p'
}
publish "$rate"

stopping=0
trap 'stopping=1' TERM INT
sleeper=
while ((stopping == 0)); do
  kill -0 "$parent" 2>/dev/null || break
  post /v3/lease/keepalive "{\"ID\":\"$lease\"}" >/dev/null || true
  if [[ -n $shared ]]; then
    n=$(teachers || true)
    [[ ${n:-0} -ge 1 ]] && publish $((shared / n))
  fi
  # In the background: a signal ends `wait` at once (a foreground sleep would delay the trap).
  sleep 0.5 &
  sleeper=$!
  wait "$sleeper" || true
done
[[ -z $sleeper ]] || kill "$sleeper" 2>/dev/null || true
post /v3/lease/revoke "{\"ID\":\"$lease\"}" >/dev/null || true
