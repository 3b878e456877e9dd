"""Sinew checkpoints of torch models, read with h5py alone (docs/checkpoint-format.md).

A checkpoint of a torch job holds the model's parameters as views named by their state_dict keys
(/model/layer1.0.conv1.weight, shaped), its float buffers as /tensors/buffers/<key> (BatchNorm's running
statistics, 1-D), and the optimiser's state as flat tensors (/tensors/optim/momentum, ...).

    sd = sinew.checkpoint.state_dict("ckpts")          # the newest committed checkpoint in a directory
    net.load_state_dict(sd, strict=False)              # (num_batches_tracked is not kept)

    python3 -m sinew.checkpoint export ckpts model.pt  # a file torch.load reads: {"model": state_dict, ...}
    python3 -m sinew.checkpoint list ckpts

Loading a checkpoint into a running job (at any world size) is the job's own --resume; this module is for
reading one outside Sinew.
"""
import json
import os
import re
import sys

_NAME = re.compile(r"^ckpt-(\d{10})(?:\.(\d+))?$")


def committed(directory):
    """The committed checkpoints in `directory`, oldest first: (step, attempt, path)."""
    out = []
    for name in os.listdir(directory):
        m = _NAME.match(name)
        path = os.path.join(directory, name)
        if not m or not os.path.isdir(path):
            continue
        if os.path.exists(os.path.join(path, "COMMITTED")) or os.path.exists(
                os.path.join(path, "manifest.h5.crc32")):
            out.append((int(m.group(1)), int(m.group(2) or 1), path))
    return sorted(out)


def manifest(path):
    """The manifest of checkpoint `path` (a checkpoint, its manifest.h5, or a directory of checkpoints:
    the newest committed one)."""
    if os.path.isfile(path):
        return path
    if os.path.exists(os.path.join(path, "manifest.h5")):
        if not (os.path.exists(os.path.join(path, "COMMITTED")) or
                os.path.exists(os.path.join(path, "manifest.h5.crc32"))):
            raise ValueError(f"{path} is not committed (a write in progress or one that failed)")
        return os.path.join(path, "manifest.h5")
    found = committed(path)
    if not found:
        raise ValueError(f"{path} holds no committed checkpoint")
    return os.path.join(found[-1][2], "manifest.h5")


def read(path):
    """{"model": {key: tensor}, "buffers": {key: tensor}, "optim": {name: tensor}, "step": int}."""
    import h5py
    import torch

    out = {"model": {}, "buffers": {}, "optim": {}, "step": None}
    with h5py.File(manifest(path), "r") as f:
        if "model" not in f:
            raise ValueError(f"{path} has no per-tensor views (/model): not a checkpoint of a named model")

        def take(prefix, group, into):
            for key, item in group.items():
                if isinstance(item, h5py.Group):
                    take(prefix + key + "/", item, into)
                else:
                    into[prefix + key] = torch.from_numpy(item[...])

        take("", f["model"], out["model"])
        if "tensors/buffers" in f:
            take("", f["tensors/buffers"], out["buffers"])
        if "tensors/optim" in f:
            take("", f["tensors/optim"], out["optim"])
        meta = f.attrs.get("training_state")
        if meta is not None:
            try:
                out["step"] = json.loads(meta).get("step")
            except (TypeError, ValueError):
                pass
    return out


def state_dict(path):
    """The model's state_dict (parameters and float buffers by key) from checkpoint `path`."""
    c = read(path)
    sd = dict(c["model"])
    sd.update(c["buffers"])
    return sd


def export(path, out):
    """Writes checkpoint `path` as a file that torch.load reads; returns the number of tensors."""
    import torch

    c = read(path)
    sd = dict(c["model"])
    sd.update(c["buffers"])
    tmp = out + ".partial"
    torch.save({"model": sd, "optim": c["optim"], "source": os.path.abspath(manifest(path))}, tmp)
    os.replace(tmp, out)  # a partial file never looks complete
    return len(sd)


def main(argv):
    import argparse

    p = argparse.ArgumentParser(prog="python3 -m sinew.checkpoint", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="write a checkpoint as a torch.load file")
    e.add_argument("checkpoint")
    e.add_argument("out")
    ls = sub.add_parser("list", help="the tensors of a checkpoint, with their shapes")
    ls.add_argument("checkpoint")
    a = p.parse_args(argv)
    try:
        if a.command == "export":
            n = export(a.checkpoint, a.out)
            print(f"{a.out}: {n} tensors of {manifest(a.checkpoint)}")
        else:
            c = read(a.checkpoint)
            for part in ("model", "buffers", "optim"):
                for k, t in c[part].items():
                    print(f"{part}/{k} {list(t.shape)}")
    except (OSError, ValueError) as err:
        print(f"sinew.checkpoint: {err}", file=sys.stderr)
        return 4  # Sinew's exit code for a checkpoint that cannot be used
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
