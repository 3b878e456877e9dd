#!/usr/bin/env bash
# The bandwidth benchmark of the communication algorithms (docs/algorithms.md): on the shaped test bed
# (hpc/net/) with 4 hosts, one Fashion-MNIST training per algorithm and PyTorch DDP (gloo) as the peers,
# plain and with its PowerSGD communication hook at Sinew's PowerSGD rank and warm-up, at
# unlimited, 1 Gbit/s and 100 Mbit/s links, all in one run. Per run: epoch time (the training steps'
# time), bytes each host put on the wire per step (its eth0 counter, every header included), and test
# accuracy after the same number of epochs. Prints a table, writes hpc/bench/results/algorithms.json and
# plots docs/img/algorithms.png.
#
# Usage: algorithms_bench.sh [EPOCHS] [RATES...]     (defaults: 1 epoch; unlimited 1gbit 100mbit)
# Needs root (network namespaces), the build (mpi_scripts/build.sh) and python3-torch (installed if missing).
# ALGORITHMS="name ..." restricts the runs (names as in the table; torch-ddp and torch-ddp-powersgd are the
# peers). POWERSGD_RANK (default 4) and POWERSGD_WARMUP (default 10 steps) apply to both PowerSGDs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
net=$root/hpc/net
. "$root/mpi_scripts/env.sh"
epochs=${1:-1}
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(unlimited 1gbit 100mbit)
n=4
psgd_rank=${POWERSGD_RANK:-4}
psgd_warmup=${POWERSGD_WARMUP:-10}
train=$SINEW_BUILD_DIR/apps/sinew-train
[ -x "$train" ] || { echo "error: $train is missing: run mpi_scripts/build.sh" >&2; exit 2; }
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  apt-get install -y -q python3-torch libopenblas0 python3-matplotlib >/dev/null
fi

# name | sinew-train options (the run's common options below)
configs=(
  "allreduce-mpi|--algorithm gradient_allreduce --allreduce mpi"
  "allreduce-ring|--algorithm gradient_allreduce --allreduce ring"
  "bytegrad|--algorithm bytegrad --error-feedback true"
  "bytegrad-4bit|--algorithm bytegrad --error-feedback true --bytegrad-bits 4"
  "powersgd|--algorithm powersgd --powersgd-rank $psgd_rank --powersgd-warmup-steps $psgd_warmup"
  "qadam|--algorithm qadam --optimizer adam --lr 0.001"
  "decentralized|--algorithm decentralized --peer-selection shift_one"
  "low-precision-decentralized|--algorithm low_precision_decentralized"
  "async|--algorithm async --sync-interval-ms 100"
  "auto|--algorithm auto"
)
wanted() { [ -z "${ALGORITHMS:-}" ] || [[ " $ALGORITHMS " == *" $1 "* ]]; }

out=$(mktemp -d)
"$net/testbed.sh" down >/dev/null
trap '"$net/testbed.sh" down >/dev/null; rm -rf "$out"' EXIT
results=$root/hpc/bench/results/algorithms.jsonl
mkdir -p "$(dirname "$results")"
: >"$results"
tx_total() { "$net/txbytes.sh" "$n" | awk '{s += $2} END {printf "%.0f\n", s}'; }

for rate in "${rates[@]}"; do
  "$net/testbed.sh" up $n "$rate" >/dev/null
  for c in "${configs[@]}"; do
    name=${c%%|*}
    wanted "$name" || continue
    read -r -a opts <<<"${c#*|}"
    echo "== $rate: $name" >&2
    before=$(tx_total)
    if ! timeout 1800 "$net/mpirun.sh" $n -- "$train" --dataset fashion-mnist --epochs "$epochs" --progress false \
      --metrics "$out/m.jsonl" "${opts[@]}" >"$out/log" 2>&1; then
      echo "error: $name at $rate failed:" >&2
      tail -n 20 "$out/log" >&2
      exit 1
    fi
    after=$(tx_total)
    /usr/bin/python3 - "$out/m.jsonl" "$name" "$rate" "$((after - before))" $n "$results" <<'PY'
import json, sys
path, name, rate, tx, n, results = sys.argv[1:]
events = [json.loads(l) for l in open(path) if l.strip()]
done = [e for e in events if e.get("event") == "done"][-1]
chosen = [e["chosen"] for e in events if e.get("event") == "algorithm"]
row = {"impl": "sinew", "name": name, "rate": rate, "epochs": done["epochs"], "steps": done["steps"],
       "epoch_s": done["train_s"] / done["epochs"], "test_accuracy": done["test_accuracy"],
       "wire_bytes_per_step": int(tx) / int(n) / done["steps"],
       "algorithm_bytes_per_step": done["bytes_sent_per_step"]}
if chosen:
    row["chosen"] = chosen[-1]
open(results, "a").write(json.dumps(row) + "\n")
PY
  done
  for peer in torch-ddp torch-ddp-powersgd; do
    wanted $peer || continue
    echo "== $rate: $peer" >&2
    popts=()
    [ $peer = torch-ddp-powersgd ] && popts=(--powersgd-rank "$psgd_rank" --powersgd-warmup-steps "$psgd_warmup")
    "$here/torch_ddp_epoch.sh" $n "$epochs" "${popts[@]}" >"$out/torch.json"
    /usr/bin/python3 - "$out/torch.json" "$rate" $n "$results" $peer <<'PY'
import json, sys
path, rate, n, results, name = sys.argv[1:]
t = json.loads(open(path).read().strip().splitlines()[-1])
row = {"impl": "torch", "name": name, "rate": rate, "epochs": t["epochs"], "steps": t["steps"],
       "epoch_s": sum(t["epoch_s"]) / len(t["epoch_s"]), "test_accuracy": t["test_accuracy"],
       "wire_bytes_per_step": t["run_tx_bytes"] / int(n) / t["steps"]}
open(results, "a").write(json.dumps(row) + "\n")
PY
  done
  "$net/testbed.sh" down >/dev/null
done
/usr/bin/python3 "$here/plot_algorithms.py" "$results" "$root/hpc/bench/results/algorithms.json" \
  "$root/docs/img/algorithms.png"
