#!/usr/bin/env bash
# Writes Fashion-MNIST where torchvision's datasets.FashionMNIST(DATA_DIR) looks for it, from Debian's
# dataset-fashion-mnist package (nothing is downloaded): DATA_DIR/FashionMNIST/raw/ then holds the four
# uncompressed IDX files, so that torchvision finds them and skips its download.
#
# usage: prepare_data.sh [DATA_DIR] [--limit-train N] [--limit-test M] [--source DIR]
#   DATA_DIR      default ../data, the directory main.py reads ('../data', relative to where it runs)
#   --limit-train N, --limit-test M
#                 keep only the first N training / M test items (images and labels alike): valid IDX files
#                 whose header holds the new count. Default: all (60000 / 10000).
#   --source DIR  the gzip files {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz
#                 (default $FASHION_MNIST_GZ, else Debian's /usr/share/datasets/fashion-mnist)
#
# Idempotent: a file already there with the requested number of items is left alone; otherwise it is
# (re)written through a temporary file and a rename, so an interrupted run leaves no torn file behind.
set -eu

data_dir=../data
limit_train=0 limit_test=0
source_dir=${FASHION_MNIST_GZ:-/usr/share/datasets/fashion-mnist}
positional=0
while [ $# -gt 0 ]; do
  case $1 in
    --limit-train) limit_train=$2; shift 2 ;;
    --limit-test) limit_test=$2; shift 2 ;;
    --source) source_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "prepare_data.sh: unknown option $1" >&2; exit 2 ;;
    *)
      [ $positional -eq 0 ] || { echo "prepare_data.sh: one DATA_DIR only" >&2; exit 2; }
      data_dir=$1 positional=1; shift ;;
  esac
done
for n in "$limit_train" "$limit_test"; do
  case $n in ''|*[!0-9]*) echo "prepare_data.sh: a limit must be a number, got '$n'" >&2; exit 2 ;; esac
done

raw=$data_dir/FashionMNIST/raw
mkdir -p "$raw"

# The work is in Python's standard library: read the gzip, keep the first LIMIT items, fix the header.
python3 - "$source_dir" "$raw" "$limit_train" "$limit_test" <<'PY'
import gzip
import os
import struct
import sys

source, raw, limit_train, limit_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
SIZES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}  # IDX type code -> bytes per value


def header(blob):
    """(dims, header length, bytes per item) of an IDX file: magic 0 0 TYPE NDIM, then NDIM big-endian
    uint32 dimensions, the first of which is the number of items."""
    zero, dtype, ndim = struct.unpack(">HBB", blob[:4])
    if zero != 0 or dtype not in SIZES or ndim < 1:
        raise ValueError("not an IDX file")
    dims = list(struct.unpack(">%dI" % ndim, blob[4:4 + 4 * ndim]))
    item = SIZES[dtype]
    for d in dims[1:]:
        item *= d
    return dims, 4 + 4 * ndim, item


def is_done(path, count):
    """Whether PATH already is a complete IDX file of COUNT items."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            dims, hlen, item = header(head)
            return dims[0] == count and os.path.getsize(path) == hlen + count * item
    except (OSError, ValueError, struct.error):
        return False


for split, limit in (("train", limit_train), ("t10k", limit_test)):
    for kind in ("images-idx3", "labels-idx1"):
        name = f"{split}-{kind}-ubyte"
        src = os.path.join(source, name + ".gz")
        dst = os.path.join(raw, name)
        # The gzip's header alone says how many items it has: read only that much to decide.
        with gzip.open(src, "rb") as f:
            total = header(f.read(64))[0][0]
        count = min(limit, total) if limit > 0 else total
        if limit > total:
            print(f"prepare_data: {name}: only {total} items, not {limit}", file=sys.stderr)
        if is_done(dst, count):
            print(f"prepare_data: {dst}: {count} items, already there")
            continue
        with gzip.open(src, "rb") as f:
            blob = f.read()
        dims, hlen, item = header(blob)
        if len(blob) < hlen + total * item:
            sys.exit(f"prepare_data: {src} is truncated")
        dims[0] = count
        out = blob[:4] + struct.pack(">%dI" % len(dims), *dims) + blob[hlen:hlen + count * item]
        tmp = dst + ".tmp"
        with open(tmp, "wb") as f:
            f.write(out)
        os.replace(tmp, dst)
        print(f"prepare_data: {dst}: {count} of {total} items")
PY
