#!/usr/bin/python3
"""A checkpoint is readable without Sinew: h5py and numpy alone rebuild the model from its per-layer views.

For the default mlp and for the cnn, a short real run of sinew-train on Fashion-MNIST (2 ranks, so the
manifest's tensors are virtual datasets over two shard files) writes a checkpoint at its end and reports
its test accuracy. This script then opens the checkpoint's manifest.h5 with h5py, reads the model
description (attributes of model/) and the views model/<layer>/<param> it names, runs the forward pass
on the 10 000 test images with numpy, preprocessed as Sinew does (src/sinew/data: p / 255, then
(x - 0.2860) / 0.3530, all in float32), and checks that it gets the accuracy Sinew reported. The same
forward pass with the weights read the wrong way round (as PyTorch's (out, in)) must come out far lower,
so that the comparison can tell right views from wrong ones.

Usage: h5py_forward.py SINEW_TRAIN MPIEXEC [MPIEXEC_FLAGS...]
Exit codes: 0 passed, 1 failed, 77 skipped (no h5py or numpy, or no Fashion-MNIST; ctest shows it skipped).
"""
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
except ImportError as e:
    print(f"SKIP h5py_forward: {e} (python3-h5py and python3-numpy; mpi_scripts/setup.sh installs them)")
    sys.exit(77)

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"  # as tests/cli/lib.sh's need_fashion_mnist
MEAN, STDDEV = np.float32(0.2860), np.float32(0.3530)  # Sinew's normalisation of Fashion-MNIST
# Steps per model: enough to be far above chance (about 80 %), so that wrong views show.
RUNS = [("mlp", 200), ("cnn", 120)]
# Sinew sums in another order than numpy (Eigen's blocked GEMM, float32), so a test image whose two
# largest logits nearly tie may be classified differently: at most this many of the 10 000.
MAX_DIFFERENT = 2


def load_idx(stem):
    """Images (n, 1, rows, cols) normalised as Sinew does, or labels (n,), from an IDX file."""
    path = os.path.join(FASHION_MNIST, stem + ".gz")
    with gzip.open(path) if os.path.exists(path) else open(path[:-3], "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    if ndim == 1:
        return data.astype(np.int64)
    # The same float32 table as src/sinew/data/idx.cpp: (p / 255 - mean) / stddev.
    table = (np.arange(256, dtype=np.float32) / np.float32(255) - MEAN) / STDDEV
    return table[data].reshape(dims[0], 1, dims[1], dims[2])


def conv2d(x, w, b, padding):
    """x (n, c, h, w); weight (c, kh, kw, o) as the view documents; stride 1, zero padding."""
    k = w.shape[1]
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))  # n, c, oh, ow, kh, kw
    y = np.tensordot(windows, w, axes=([1, 4, 5], [0, 1, 2]))  # n, oh, ow, o
    return y.transpose(0, 3, 1, 2) + b[None, :, None, None]


def maxpool2d(x, kernel, stride):
    assert kernel == 2 and stride == 2, (kernel, stride)
    n, c, h, w = x.shape
    oh, ow = h // 2, w // 2
    return x[:, :, :2 * oh, :2 * ow].reshape(n, c, oh, 2, ow, 2).max(axis=(3, 5))


def forward(layers, params, x, wrong_linear=False):
    """The forward pass from the description alone. x: (n, c, h, w) float32; returns the logits (n, classes).
    wrong_linear reads each linear weight as if it were PyTorch's (out, in): the mistake the test must catch."""
    for layer in layers:
        kind, p = layer["kind"], {k: params[v] for k, v in layer.get("params", {}).items()}
        if kind == "linear":  # y = x @ weight + bias, x flattened in C order (channel, row, column)
            w = p["weight"]
            if wrong_linear:
                w = w.reshape(w.shape[1], w.shape[0]).T
            x = x.reshape(x.shape[0], -1) @ w + p["bias"]
        elif kind == "conv2d":
            assert layer["stride"] == 1, layer
            x = conv2d(x, p["weight"], p["bias"], layer["padding"])
        elif kind == "maxpool2d":
            x = maxpool2d(x, layer["kernel"], layer["stride"])
        elif kind == "relu":
            x = np.maximum(x, np.float32(0))
        else:
            raise SystemExit(f"FAIL: layer {layer['name']} has a kind this reader does not know: {kind}")
        expected = tuple(layer["output_shape"])
        got = x.shape[1:] if x.ndim == 4 else (x.shape[1], 1, 1)
        if got != expected:
            raise SystemExit(f"FAIL: layer {layer['name']} gives {got}, its description says {expected}")
    return x


def accuracy(layers, params, images, labels, **kw):
    correct = 0
    for s in range(0, len(images), 500):  # chunks: the conv windows of all 10 000 images at once are GBs
        logits = forward(layers, params, images[s:s + 500], **kw)
        correct += int((logits.argmax(axis=1) == labels[s:s + 500]).sum())
    return correct


def text(value):
    """An h5py string attribute (bytes or str, by h5py version) as str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def read_checkpoint(manifest):
    """The description and the views it names, with h5py alone."""
    with h5py.File(manifest, "r") as f:
        if "model" not in f:
            raise SystemExit(f"FAIL: {manifest} has no model/ group (per-layer views)")
        g = f["model"]
        for attr in ("spec", "input_shape", "num_classes", "layers"):
            if attr not in g.attrs:
                raise SystemExit(f"FAIL: {manifest}: model/ lacks the attribute {attr} (the model description)")
        spec, layers = text(g.attrs["spec"]), json.loads(text(g.attrs["layers"]))
        params = {}
        for layer in layers:
            for name in layer.get("params", {}).values():
                ds = g[name]
                params[name] = ds[...].astype(np.float32)
                # Each view is a slice of its flat tensor: the same elements, shaped.
                flat = f["tensors/" + text(ds.attrs["tensor"])]
                off = int(ds.attrs["offset"])
                if not np.array_equal(flat[off:off + params[name].size], params[name].ravel()):
                    raise SystemExit(f"FAIL: {manifest}: model/{name} is not elements [{off}, ...) of its tensor")
        return spec, [int(v) for v in g.attrs["input_shape"]], layers, params


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    train, mpiexec = sys.argv[1], sys.argv[2:]
    if not os.path.exists(os.path.join(FASHION_MNIST, "train-images-idx3-ubyte.gz")):
        print(f"SKIP h5py_forward: {FASHION_MNIST} is not installed (dataset-fashion-mnist; "
              "mpi_scripts/setup.sh installs it)")
        return 77
    images, labels = load_idx("t10k-images-idx3-ubyte"), load_idx("t10k-labels-idx1-ubyte")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sinew-h5py-") as work:
        for spec, steps in RUNS:
            ckdir, metrics = os.path.join(work, spec + "-ck"), os.path.join(work, spec + ".jsonl")
            cmd = mpiexec + ["-n", "2", train, "--dataset", "fashion-mnist", "--model", spec, "--epochs", "1",
                             "--max-steps", str(steps), "--checkpoint-dir", ckdir, "--metrics", metrics,
                             "--progress", "false"]
            try:
                run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150)
            except subprocess.TimeoutExpired as e:
                out = (e.stdout or b"")[-3000:].decode(errors="replace")  # bytes, whatever text= says
                print(f"FAIL {spec}: sinew-train ran past 150 s:\n{out}")
                failed += 1
                continue
            if run.returncode != 0:
                print(f"FAIL {spec}: sinew-train exited {run.returncode}:\n" + run.stdout[-3000:])
                failed += 1
                continue
            events = [json.loads(line) for line in open(metrics) if line.strip()]
            done = [e for e in events if e.get("event") == "done"]
            ckpts = sorted(glob.glob(os.path.join(ckdir, "ckpt-*[0-9]")))
            if not done or not ckpts:
                print(f"FAIL {spec}: no done event in {metrics} or no checkpoint in {ckdir}")
                failed += 1
                continue
            # The checkpoint at the end holds the model that was evaluated (stopped inside the epoch).
            n = len(labels)
            sinew_correct = round(done[-1]["test_accuracy"] * n)
            got_spec, input_shape, layers, params = read_checkpoint(os.path.join(ckpts[-1], "manifest.h5"))
            if got_spec != spec or input_shape != [1, 28, 28]:
                print(f"FAIL {spec}: model/ says spec {got_spec!r}, input {input_shape}")
                failed += 1
                continue
            correct = accuracy(layers, params, images, labels)
            wrong = accuracy(layers, params, images, labels, wrong_linear=True)
            print(f"{spec}: {steps} steps, Sinew {100 * sinew_correct / n:.2f} %, h5py + numpy "
                  f"{100 * correct / n:.2f} % ({abs(correct - sinew_correct)} of {n} differ), "
                  f"linear weights read as (out, in): {100 * wrong / n:.2f} %")
            if abs(correct - sinew_correct) > MAX_DIFFERENT:
                print(f"FAIL {spec}: h5py + numpy classify {correct} of {n} test images correctly, Sinew "
                      f"{sinew_correct}")
                failed += 1
            elif sinew_correct < 0.6 * n or wrong > 0.5 * n:
                print(f"FAIL {spec}: the run cannot tell right views from wrong ones (Sinew {sinew_correct}, "
                      f"wrong layout {wrong} of {n})")
                failed += 1
            else:
                print(f"ok   {spec}")
    print(f"{len(RUNS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
