#!/usr/bin/env python3
"""Writes Fashion-MNIST as PNG files in torchvision's ImageFolder layout: DIR/<class name>/<index>.png.

    python3 make_images.py --out data/train --per-class 600 --test-per-class 100   # test: data/test

The source is Debian's dataset-fashion-mnist (gzip IDX files; nothing is downloaded). The first N images of
each class in the file's order are written, named by their index in that file, so that a tree is the same
wherever and whenever it is made. Idempotent: a tree that already holds the requested number of images of
every class is left as it is; any other tree is written anew in a sibling directory and put in its place
when complete, so that an interrupted run never leaves a tree that looks complete.
"""
import argparse
import gzip
import os
import shutil
import sys

import numpy as np
from PIL import Image

# Fashion-MNIST's labels 0..9, as directory names ('/' and ' ' are no friends of paths). ImageFolder numbers
# the classes in the sorted order of these names, not in this one: the labels are its own.
CLASSES = ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"]
SPLITS = {"train": "train", "test": "t10k"}  # split -> the prefix of its IDX files


def read_idx(path, magic):
    """The array of a gzip IDX file: uint8 images (n x rows x cols, magic 2051) or labels (n, magic 2049)."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    got = int.from_bytes(data[0:4], "big")
    if got != magic:
        raise SystemExit(f"error: {path}: magic number {got}, expected {magic} (not an IDX file of this kind)")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def is_complete(root, per_class):
    """Whether `root` holds exactly `per_class` PNG files in each class directory."""
    try:
        return all(sum(n.endswith(".png") for n in os.listdir(os.path.join(root, c))) == per_class
                   for c in CLASSES)
    except FileNotFoundError:
        return False


def write_tree(source, split, root, per_class):
    """Writes the first `per_class` images of each class of `split` under `root`; returns what it did."""
    if is_complete(root, per_class):
        return f"{root}: complete ({per_class} images per class), left as it is"
    # Replacing a tree removes it: only one that holds nothing but class directories (one of ours).
    if os.path.exists(root):
        foreign = [n for n in os.listdir(root) if n not in CLASSES]
        if foreign:
            raise SystemExit(f"error: {root} exists and holds {foreign[0]!r}, which is no class directory of "
                             "Fashion-MNIST: give another --out (or --test-out)")
    prefix = os.path.join(source, SPLITS[split])
    images = read_idx(f"{prefix}-images-idx3-ubyte.gz", 2051)
    labels = read_idx(f"{prefix}-labels-idx1-ubyte.gz", 2049)
    if len(images) != len(labels):
        raise SystemExit(f"error: {prefix}: {len(images)} images but {len(labels)} labels")

    tmp = f"{root.rstrip(os.sep)}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for label, name in enumerate(CLASSES):
        chosen = np.flatnonzero(labels == label)[:per_class]
        if len(chosen) < per_class:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SystemExit(f"error: the {split} split has {len(chosen)} images of {name}, fewer than {per_class}")
        os.makedirs(os.path.join(tmp, name))
        width = len(str(len(labels) - 1))  # zero-padded: the files sort in the source's order
        for i in chosen:
            Image.fromarray(images[i]).save(os.path.join(tmp, name, f"{i:0{width}d}.png"))
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(tmp, root)
    return f"{root}: wrote {per_class} images per class ({per_class * len(CLASSES)} in all)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="the training tree's directory")
    p.add_argument("--per-class", type=int, default=600, help="training images per class (default 600)")
    p.add_argument("--test-per-class", type=int, default=100,
                   help="test images per class (default 100; 0: no test tree)")
    p.add_argument("--test-out", help="the test tree's directory (default: 'test' beside --out)")
    p.add_argument("--source", default="/usr/share/datasets/fashion-mnist",
                   help="the directory of the gzip IDX files (default: Debian's dataset-fashion-mnist)")
    args = p.parse_args()
    if args.per_class <= 0 or args.test_per_class < 0:
        p.error("--per-class must be positive and --test-per-class not negative")
    if not os.path.isfile(os.path.join(args.source, "train-images-idx3-ubyte.gz")):
        sys.exit(f"error: Fashion-MNIST not found in {args.source}: apt-get install dataset-fashion-mnist, "
                 "or give --source")

    out = os.path.abspath(args.out)
    print(write_tree(args.source, "train", out, args.per_class))
    if args.test_per_class:
        test_out = os.path.abspath(args.test_out or os.path.join(os.path.dirname(out), "test"))
        if test_out == out:
            p.error("--test-out is the training tree")
        print(write_tree(args.source, "test", test_out, args.test_per_class))


if __name__ == "__main__":
    main()
