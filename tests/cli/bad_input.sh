#!/usr/bin/env bash
# Bad input to sinew-train: each case must exit with the documented code and print a message that names
# the problem. Usage: bad_input.sh SINEW_TRAIN MPIEXEC [MPIEXEC_FLAGS...]
set -u
train=$1
shift
mpiexec=("$@")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

fm=/usr/share/datasets/fashion-mnist
# A small copy of Fashion-MNIST that the data cases below damage one file at a time.
mkdir -p "$work/good"
if [ -d "$fm" ]; then
  cp "$fm"/*.gz "$work/good/"
fi

# --- usage errors: exit 2, one line naming the option ---------------------------------------------
expect unknown-option 2 "unrecognised option '--bogus'|unrecognized option '--bogus'" -- "$train" --bogus
expect malformed-number 2 "epochs" -- "$train" --epochs three
expect zero-epochs 2 "--epochs must be >= 1" -- "$train" --epochs 0
expect negative-lr 2 "--lr must be a positive number" -- "$train" --lr -1
expect bad-optimizer 2 "--optimizer: unknown value 'rmsprop'" -- "$train" --optimizer rmsprop
expect bad-dataset 2 "--dataset: unknown value 'cifar'" -- "$train" --dataset cifar
expect bad-log-level 2 "--log-level: unknown level 'loud'" -- "$train" --log-level loud
expect every-needs-dir 2 "--checkpoint-every needs --checkpoint-dir" -- "$train" --checkpoint-every 5
expect bad-elastic 2 "--elastic: unknown value 'sometimes'" -- "$train" --elastic sometimes
expect bad-fault-phase 2 "--inject-fault: '1:fly:3' is not RANK:POINT:STEP" -- "$train" --inject-fault 1:fly:3
expect bad-schedule 2 "--resize-schedule: '20:0' is not STEP:SIZE" -- "$train" --resize-schedule 10:2,20:0
expect bad-schedule-order 2 "--resize-schedule: '5:3' is not STEP:SIZE" -- "$train" --resize-schedule 10:2,5:3
expect min-above-max 2 "--max-ranks 2 is below --min-ranks 3" -- "$train" --min-ranks 3 --max-ranks 2
expect missing-value 2 "batch-size" -- "$train" --batch-size
expect missing-config 2 "--config: cannot open" -- "$train" --config "$work/nope.cfg"
printf 'epochs = 2\nfrobnicate = 1\n' >"$work/bad.cfg"
expect bad-config-key 2 "frobnicate" -- "$train" --config "$work/bad.cfg"
expect bad-model 2 "model" -- "${mpiexec[@]}" -n 2 "$train" --model transformer --dataset synthetic
expect spares-negative 2 "--spares must be in \\[0, 4096\\], got -1" -- "$train" --spares -1
expect spares-no-grow 2 "--spares 1 replaces failed ranks in place: it needs --elastic inplace and --grow true" \
  -- "$train" --spares 1 --grow false
expect spares-too-many 2 "--spares 2 needs more than 2 processes \\(members plus spares\\), this job has 2" \
  -- "${mpiexec[@]}" -n 2 "$train" --dataset synthetic --spares 2
expect help 0 "usage: mpirun -n N sinew-train" -- "$train" --help

# one line only, even with 4 ranks
out=$("${mpiexec[@]}" -n 4 "$train" --bogus 2>&1)
if [ "$(grep -c 'sinew: error' <<<"$out")" -eq 1 ]; then
  passed=$((passed + 1)); echo "ok   usage-error-printed-once"
else
  failed=$((failed + 1)); echo "FAIL usage-error-printed-once:"; sed 's/^/     | /' <<<"$out" | head
fi

# --- checkpoint errors: exit 4, naming the checkpoint ----------------------------------------------
expect resume-missing 4 "cannot resume: $work/no-such-ckpt: no such checkpoint" -- "${mpiexec[@]}" -n 2 "$train" --dataset synthetic \
  --model mlp:8 --max-steps 2 --resume "$work/no-such-ckpt"

# --- data errors: exit 3, naming the file ---------------------------------------------------------
run=("${mpiexec[@]}" -n 2 "$train" --dataset fashion-mnist --epochs 1 --max-steps 2 --progress false)
expect missing-dir 3 "$work/absent/train-images-idx3-ubyte.gz" -- "${run[@]}" --data-dir "$work/absent"
if [ -d "$fm" ]; then
  for case in truncated corrupt badmagic shortlabels; do
    rm -rf "$work/$case"; cp -r "$work/good" "$work/$case"
  done
  # truncated: the gzip stream stops half-way
  f="$work/truncated/train-images-idx3-ubyte.gz"; head -c $(( $(stat -c %s "$f") / 2 )) "$f" >"$f.x" && mv "$f.x" "$f"
  expect truncated-gzip 3 "train-images-idx3-ubyte.gz" -- "${run[@]}" --data-dir "$work/truncated"
  # corrupt: bytes in the middle of the deflate stream overwritten
  f="$work/corrupt/t10k-images-idx3-ubyte.gz"; printf 'garbagegarbagegarbage' | dd of="$f" bs=1 seek=5000 conv=notrunc status=none
  expect corrupt-gzip 3 "t10k-images-idx3-ubyte.gz" -- "${run[@]}" --data-dir "$work/corrupt"
  # wrong magic: a labels file where images are expected
  cp "$work/badmagic/train-labels-idx1-ubyte.gz" "$work/badmagic/train-images-idx3-ubyte.gz"
  expect wrong-magic 3 "train-images-idx3-ubyte.gz.*magic|magic.*train-images-idx3-ubyte.gz" -- "${run[@]}" --data-dir "$work/badmagic"
  # images and labels disagree in count
  gunzip -c "$work/shortlabels/t10k-labels-idx1-ubyte.gz" | python3 -c '
import sys, struct
d = sys.stdin.buffer.read()
n = struct.unpack(">I", d[4:8])[0] - 10
sys.stdout.buffer.write(d[:4] + struct.pack(">I", n) + d[8:8 + n])' | gzip >"$work/short.gz"
  mv "$work/short.gz" "$work/shortlabels/t10k-labels-idx1-ubyte.gz"
  expect count-mismatch 3 "t10k-(images|labels).*(count|items|labels|images)" -- "${run[@]}" --data-dir "$work/shortlabels"
else
  skip damaged-file-cases "$fm is not installed (dataset-fashion-mnist)"
fi

finish
