#!/usr/bin/env python3
"""Recovery with sharded state: kill -> back at the failed step on a 35 M-parameter transformer with AdamW,
Sinew's sharded optimizer state against torchrun restarting FSDP2 from its newest DCP checkpoint, in one run.

    "$SINEW_TORCH_VENV/bin/python" hpc/bench/shard_recovery_bench.py [--rounds 3] [--seed 1] [--ckpt-every 5]

The model, optimizer and data are shard_torch_bench.py's (its build() and adamw(): a torch.nn transformer
encoder, 6 layers, width 512, vocab 32 000, 35.3 M parameters; AdamW with weight decay on the matrices only;
2 sequences of 32 synthetic tokens per rank and step; one torch thread per rank), 4 ranks, each as a script's
own loop. Modes:
  sinew whole   sinew.init(), --shard none: the survivors recover in place (--grow false: 3 ranks after) and
                redo the failed step from their memory;
  sinew R=2     shard="optimizer", shard_replicas=2 (ZeRO-1, each shard of AdamW's state on two ranks): in place,
                the dead rank's shards rebuilt from their replicas and resharded over the 3 survivors;
  sinew ZeRO-3 R=2   shard="parameters", shard_replicas=2: the parameters and gradients sharded too (the encoder
                layers are the units), the same recovery in place;
  sinew R=1     shard="optimizer", shard_replicas=1 (no redundancy): the dead rank's shard is lost, the job
                exits 75 and sinew-run (mpi_scripts/sinew-run) relaunches it on the 3 surviving slots from its
                newest checkpoint (Sinew's HDF5, the same --ckpt-every);
  sinew ZeRO-3 R=1   shard="parameters", shard_replicas=1: the same fallback with sharded parameters (as when
                both holders of a shard die at R = 2);
  torchrun      torchrun --max-restarts 3, torch.distributed.fsdp.fully_shard per encoder layer and the root
                (FSDP2, ZeRO-3) over gloo on the CPU, AdamW; every --ckpt-every steps the model's and the
                optimizer's sharded state dicts are saved with torch.distributed.checkpoint (DCP), and every start
                loads the newest; when a worker dies the agent stops the others and restarts all 4.
Every mode saves every --ckpt-every steps; within a round launch rank 2 kills itself with SIGKILL at the top of
the same step K (drawn from --min-step..--max-step, all rounds from one seed), before its forward pass, and the
modes run one after the other in an order rotated per round (the machine may be shared: compare the ratios,
measured within a round). Measured from the kill until rank 0 has completed step K again (its own records, the
same for every mode), with the parts each mode reports (Sinew in place: its failure event's detection, revoke +
shrink + agree, rebuild, state sync and of it the reshard, the redone step; a relaunch: until the job exited,
the relaunch, the checkpoint load, the replay), and the steps of work lost (completed steps computed again; the
failed step itself is redone by every mode and not counted). For Sinew in place also the recovery itself, from
the failure's detection to the state rebuilt, resharded and ready (revoke + shrink + agree, rebuild, state sync):
the figure issue 51's "under 1 s" is about. Before the rounds, the machine's first write of fresh memory against
a rewrite of it (a reshard makes the new layout's state in fresh memory). Medians over --rounds; the ratio
torchrun / mode is the median of each round's own ratio. Writes DIR/shard_recovery.json (default
hpc/bench/results); --keep DIR keeps every run's records, metrics and logs there.
"""
import argparse
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from shard_torch_bench import SEQ, adamw, build  # noqa: E402
from torch_recovery_bench import RANKS, VICTIM, events, mpi_env, worker_env  # noqa: E402

BATCH = 2
MODES = ["sinew whole", "sinew R=2", "sinew ZeRO-3 R=2", "sinew R=1", "sinew ZeRO-3 R=1", "torchrun"]
SHARD = {"sinew whole": ["--shard", "none"],
         "sinew R=2": ["--shard", "optimizer", "--shard-replicas", "2"],
         "sinew ZeRO-3 R=2": ["--shard", "parameters", "--shard-replicas", "2"],
         "sinew R=1": ["--shard", "optimizer", "--shard-replicas", "1"],
         "sinew ZeRO-3 R=1": ["--shard", "parameters", "--shard-replicas", "1"]}


def log(path, **record):
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def tokens(a, world):
    """The synthetic batches of every step: the same tensors in every mode."""
    import torch
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, a.vocab, ((a.steps + 4) * BATCH * world, SEQ), generator=g)
    return x, torch.randint(0, 10, (len(x),), generator=g)


def die(a, step):
    """Launch rank VICTIM, first start only: record the time and kill -9 itself at the top of step K."""
    log(a.record, event="kill", step=step, unix_time=time.time())
    os.kill(os.getpid(), signal.SIGKILL)


def sinew_worker(a):
    """One rank of a Sinew mode: the script's own loop (shard_torch_bench's), options from SINEW_OPTIONS."""
    import torch
    import torch.nn.functional as F
    import sinew
    from torch.utils.data import DataLoader, TensorDataset
    torch.set_num_threads(1)
    generation = int(os.environ.get("SINEW_RESTART_GENERATION", "0"))
    job = sinew.init()
    model = job.wrap(build(a), "transformer")
    groups, cls, kw = adamw(model.parameters())
    opt = cls(groups, **kw)
    x, y = tokens(a, RANKS)
    data = TensorDataset(x, y)
    loader = DataLoader(data, sampler=job.sampler(data), batch_size=BATCH)
    victim = generation == 0 and job.rank == VICTIM
    it, last = 0, None
    for _ in job.epochs(1):
        for xb, yb in loader:
            it += 1  # this process's iterations: the step's number until the first failure
            if victim and it == a.fail_step:
                die(a, it)
            if last is None and job.rank == 0:
                log(a.record, event="resume", step=job.step, restart=generation, unix_time=time.time())
                last = job.step
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            if job.rank == 0 and job.step != last:  # a step completed (not the failed iteration)
                last = job.step
                log(a.record, event="step", step=job.step, restart=generation, it=it, unix_time=time.time())
    return 0


def fsdp_worker(a):
    """One torchrun worker: FSDP2 over gloo, AdamW, DCP saves every --ckpt-every steps, resumes from the newest."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.fsdp import fully_shard
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # Each start's keys under a prefix of their own (torchrun_job.py says why: the agent's store outlives a
    # restart and the dead round's addresses would be read).
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"start{restart}", store), rank=rank, world_size=world)
    net = build(a)
    for layer in net.layers:
        fully_shard(layer)
    model = fully_shard(net)
    groups, cls, kw = adamw(model.parameters())
    opt = cls(groups, **kw)
    start, load_ms = 0, 0.0
    latest = os.path.join(a.ckpt, "latest")
    if os.path.exists(latest):
        t = time.perf_counter()
        with open(latest) as f:
            start = int(f.read())
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=os.path.join(a.ckpt, f"step-{start}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        load_ms = (time.perf_counter() - t) * 1e3
    if rank == 0:
        log(a.record, event="resume", step=start, restart=restart, load_ms=load_ms, unix_time=time.time())
    x, y = tokens(a, world)
    for step in range(start + 1, a.steps + 1):
        if restart == 0 and rank == VICTIM and step == a.fail_step:
            die(a, step)
        i = ((step - 1) * world + rank) * BATCH
        opt.zero_grad()
        F.cross_entropy(model(x[i:i + BATCH]), y[i:i + BATCH]).backward()
        opt.step()
        if rank == 0:
            log(a.record, event="step", step=step, restart=restart, unix_time=time.time())
        if step % a.ckpt_every == 0:
            t = time.perf_counter()
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(a.ckpt, f"step-{step}"))
            if rank == 0:  # the coordinator wrote the metadata when save() returned: point at it atomically
                with open(latest + ".tmp", "w") as f:
                    f.write(str(step))
                os.replace(latest + ".tmp", latest)
                log(a.record, event="save", step=step, ms=(time.perf_counter() - t) * 1e3)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def model_args(a, d, fail_step):
    return ["--steps", str(fail_step + 2), "--fail-step", str(fail_step), "--ckpt-every", str(a.ckpt_every),
            "--record", f"{d}/steps.jsonl", "--ckpt", f"{d}/ckpt", "--layers", str(a.layers), "--width",
            str(a.width), "--vocab", str(a.vocab)]


def sinew_options(d, fail_step, a):
    return ["--max-steps", str(fail_step + 2), "--log-every", "1", "--progress", "false", "--metrics",
            f"{d}/metrics.jsonl", "--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every", str(a.ckpt_every),
            "--grow", "false"]


def records(d, fail_step):
    """The kill, rank 0's records, its steps of the relaunched start (if any), and back: the first time step K
    was completed (never before the kill: the victim's part of it is missing until then)."""
    ev = events(f"{d}/steps.jsonl")
    kill = next(e for e in ev if e["event"] == "kill")
    steps = [e for e in ev if e["event"] == "step"]
    back = next(e for e in steps if e["step"] >= fail_step)
    if back["step"] != fail_step or back["unix_time"] < kill["unix_time"]:
        raise SystemExit(f"rank 0 recorded step {back['step']} after the kill, not {fail_step}: {ev}")
    return ev, kill, [e for e in steps if e["restart"] >= 1], back


def run(cmd, what, env, d):
    """Runs one mode's job; its output goes to d/stdout.txt and d/stderr.txt as well (kept with --keep)."""
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    for name, text in (("stdout.txt", r.stdout), ("stderr.txt", r.stderr)):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r


@contextlib.contextmanager
def run_dir(a, name):
    """A directory for one run's checkpoints, records, metrics and output: a temporary one, or with --keep one kept
    under that directory (its path printed), for what a round's logs say after the bench."""
    if not a.keep:
        with tempfile.TemporaryDirectory(dir=a.tmp) as d:
            yield d
        return
    os.makedirs(a.keep, exist_ok=True)
    d = tempfile.mkdtemp(dir=a.keep, prefix=name.replace(" ", "-").replace("=", "") + "-")
    print(f"{name}: its run's files kept in {d}", file=sys.stderr, flush=True)
    yield d


def first_touch(mb=578):
    """(GB/s) this machine's first write of fresh memory (the kernel gives each 4 KiB page on its first touch) and
    a rewrite of the same memory, one thread: a reshard makes the new layout's state in fresh memory, so its time
    is bound by the first (578 MB: AdamW's state of 108 M parameters, 2 shards of 4 -> 3 ranks, per rank)."""
    import torch
    torch.set_num_threads(1)
    n = mb * 2**20 // 4
    t = time.perf_counter()
    x = torch.empty(n)
    x[::1024].fill_(1.0)  # one float per 4 KiB page
    first = time.perf_counter() - t
    t = time.perf_counter()
    x.fill_(2.0)
    again = time.perf_counter() - t
    del x
    return mb * 2**20 / first / 1e9, mb * 2**20 / again / 1e9


def sinew_in_place(mode, a, fail_step, env):
    mpirun, flags, _ = mpi_env()
    with run_dir(a, mode) as d:
        opts = sinew_options(d, fail_step, a) + SHARD[mode]
        cmd = [mpirun, *flags, "-n", str(RANKS), "-x", "PYTHONPATH", "-x", "SINEW_OPTIONS", "-x", "OMP_NUM_THREADS",
               sys.executable, os.path.abspath(__file__), "--worker", "sinew", *model_args(a, d, fail_step)]
        run(cmd, mode, dict(env, SINEW_OPTIONS=" ".join(opts)), d)
        ev, kill, _, back = records(d, fail_step)
        before = next(e for e in ev if e["event"] == "step" and e["step"] == fail_step - 1)
        ev = events(f"{d}/metrics.jsonl")
        f = next(e for e in ev if e.get("event") == "failure")
        rec = next(e for e in ev if e.get("event") == "recovered")
        if f["world_size"] != RANKS - 1:
            raise SystemExit(f"{mode}: the failure event says {f['world_size']} ranks after: {f}")
        parts = {"detect": (f["detected_unix_time"] - kill["unix_time"]) * 1e3,
                 "revoke+shrink+agree": f["revoke_ms"] + f["shrink_ms"] + f["agree_ms"],
                 "rebuild": f["rebuild_ms"], "state sync": f["sync_ms"],
                 "of it reshard": f["reshard_ms"] if f.get("reshard_ms", -1) >= 0 else None,
                 "redone step": rec["first_step_ms"]}
        parts["other"] = max(0.0, rec["total_ms"] - sum(v for k, v in parts.items()
                                                         if k not in ("detect", "of it reshard") and v is not None))
        return {"total_ms": (back["unix_time"] - kill["unix_time"]) * 1e3,
                "event_total_ms": parts["detect"] + rec["total_ms"],
                # the "recovery itself": from the failure's detection to the state rebuilt, resharded
                # and ready (before the failed step is computed again)
                "recovery_ms": parts["revoke+shrink+agree"] + parts["rebuild"] + parts["state sync"],
                "lost_steps": f["step"] - f.get("resumed_step", f["step"]), "parts_ms": parts,
                "world_after": f["world_size"],
                # rank 0's state kept by moving its pages into the new layout instead of copying (MB)
                "moved_mb": f.get("reshard_moved_bytes", 0) / 1e6,
                # rank 0's loop iterations for step K: the failed one, the redo, and any the loader dropped
                "iterations_for_step_k": back["it"] - before["it"]}


def sinew_relaunch(mode, a, fail_step, env):
    with run_dir(a, mode) as d:
        cmd = [f"{ROOT}/mpi_scripts/sinew-run", "-n", str(RANKS), "--events", f"{d}/sup.jsonl", "--max-restarts",
               "2", *sinew_options(d, fail_step, a), *SHARD[mode], "--", sys.executable, os.path.abspath(__file__),
               "--worker", "sinew", *model_args(a, d, fail_step)]
        r = run(cmd, mode, env, d)
        if "all lost (--shard-replicas 1)" not in r.stdout + r.stderr:
            raise SystemExit(f"{mode}: no lost shard reported:\n{r.stderr[-3000:]}")
        ev, kill, after, back = records(d, fail_step)
        sup = events(f"{d}/sup.jsonl")
        t_exit = next(e for e in sup if e["event"] == "exit" and e["generation"] == 0)["unix_time"]
        launch = next(e for e in sup if e["event"] == "launch" and e["generation"] == 1)
        met = events(f"{d}/metrics.jsonl")
        res = next(e for e in met if e.get("event") == "resume" and e.get("generation") == 1)
        first = after[0]
        parts = {"until the job exited": (t_exit - kill["unix_time"]) * 1e3,
                 "to the relaunch": (launch["unix_time"] - t_exit) * 1e3,
                 "start": (res["unix_time"] - launch["unix_time"]) * 1e3 - res["load_ms"],
                 "checkpoint load": res["load_ms"],
                 "first step": (first["unix_time"] - res["unix_time"]) * 1e3,
                 "replay": (back["unix_time"] - first["unix_time"]) * 1e3}
        return {"total_ms": (back["unix_time"] - kill["unix_time"]) * 1e3,
                "lost_steps": fail_step - 1 - res["step"], "parts_ms": parts, "world_after": launch["ranks"]}


def torchrun(a, fail_step, env):
    with run_dir(a, "torchrun") as d:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        runner = os.path.join(os.path.dirname(sys.executable), "torchrun")
        cmd = [runner, "--nnodes", "1", "--nproc-per-node", str(RANKS), "--max-restarts", "3",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", os.path.abspath(__file__),
               "--worker", "fsdp", *model_args(a, d, fail_step)]
        run(cmd, "torchrun", env, d)
        ev, kill, after, back = records(d, fail_step)
        res = next(e for e in ev if e["event"] == "resume" and e["restart"] >= 1)
        first = after[0]
        saves = [e["ms"] for e in ev if e["event"] == "save"]
        parts = {"to the resume": (res["unix_time"] - kill["unix_time"]) * 1e3 - res["load_ms"],
                 "checkpoint load": res["load_ms"],
                 "first step": (first["unix_time"] - res["unix_time"]) * 1e3,
                 "replay": (back["unix_time"] - first["unix_time"]) * 1e3}
        return {"total_ms": (back["unix_time"] - kill["unix_time"]) * 1e3, "lost_steps": fail_step - 1 - res["step"],
                "parts_ms": parts, "world_after": RANKS, "save_ms": statistics.median(saves) if saves else None}


def median_parts(rs):
    keys = rs[0]["parts_ms"]
    return {k: (None if rs[0]["parts_ms"][k] is None else statistics.median(r["parts_ms"][k] for r in rs))
            for k in keys}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=5, help="steps between saves, every mode")
    p.add_argument("--min-step", type=int, default=8)
    p.add_argument("--max-step", type=int, default=14)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tmp", default=None, help="where the runs' checkpoints go (default: the system's temp dir)")
    p.add_argument("--keep", default=None, help="keep each run's files (records, metrics, logs) under this directory")
    p.add_argument("--out", default=os.path.join(ROOT, "hpc", "bench", "results"))
    p.add_argument("--build", default=os.environ.get("SINEW_BUILD_DIR", os.path.join(ROOT, "build")))
    # A worker's own arguments (set by the modes above).
    p.add_argument("--worker", choices=["sinew", "fsdp"])
    p.add_argument("--steps", type=int, default=0)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--record", default="")
    p.add_argument("--ckpt", default="")
    a = p.parse_args()
    if a.worker == "sinew":
        return sinew_worker(a)
    if a.worker == "fsdp":
        return fsdp_worker(a)
    import torch
    modes = a.modes.split(",")
    env = worker_env(a.build)
    rng = random.Random(a.seed)
    runs = {m: [] for m in modes}
    steps = []
    touch = first_touch()
    print(f"this machine: a first write of fresh memory {touch[0]:.2f} GB/s, a rewrite of it {touch[1]:.1f} GB/s "
          "(one thread, 578 MB)", file=sys.stderr, flush=True)
    t0 = time.time()
    for k in range(a.rounds):
        fail_step = rng.randint(a.min_step, a.max_step)
        steps.append(fail_step)
        order = modes[k % len(modes):] + modes[:k % len(modes)]
        for mode in order:
            if mode == "torchrun":
                r = torchrun(a, fail_step, env)
            elif mode.endswith("R=1"):  # the dead rank's shard is lost: the fallback
                r = sinew_relaunch(mode, a, fail_step, env)
            else:
                r = sinew_in_place(mode, a, fail_step, env)
            runs[mode].append(r)
            print(f"round {k + 1}/{a.rounds}, kill at step {fail_step}: {mode} {r['total_ms']:.0f} ms, "
                  f"{r['lost_steps']} steps lost, parts " +
                  ", ".join(f"{n} {v:.0f}" for n, v in r["parts_ms"].items() if v is not None),
                  file=sys.stderr, flush=True)
    params = sum(t.numel() for t in build(a).parameters())
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "cores": os.cpu_count(), "torch": torch.__version__,
           "params": params, "layers": a.layers, "width": a.width, "vocab": a.vocab, "ranks": RANKS,
           "victim": VICTIM, "batch": BATCH, "seq": SEQ, "ckpt_every": a.ckpt_every, "seed": a.seed,
           "rounds": a.rounds, "fail_steps": steps, "wall_s": time.time() - t0,
           "first_touch_gbps": touch[0], "rewrite_gbps": touch[1], "modes": {}}
    for m, rs in runs.items():
        out["modes"][m] = {"total_ms": statistics.median(r["total_ms"] for r in rs), "parts_ms": median_parts(rs),
                           "totals_ms": [r["total_ms"] for r in rs], "lost_steps": [r["lost_steps"] for r in rs],
                           "world_after": rs[0]["world_after"]}
        if "recovery_ms" in rs[0]:
            out["modes"][m]["recovery_ms"] = statistics.median(r["recovery_ms"] for r in rs)
            out["modes"][m]["recoveries_ms"] = [r["recovery_ms"] for r in rs]
            out["modes"][m]["moved_mb"] = [r.get("moved_mb", 0) for r in rs]
        if "event_total_ms" in rs[0]:
            out["modes"][m]["event_total_ms"] = statistics.median(r["event_total_ms"] for r in rs)
        if "iterations_for_step_k" in rs[0]:
            out["modes"][m]["iterations_for_step_k"] = [r["iterations_for_step_k"] for r in rs]
        if rs[0].get("save_ms") is not None:
            out["modes"][m]["save_ms"] = statistics.median(r["save_ms"] for r in rs)
        if "torchrun" in runs:
            out["modes"][m]["torchrun_over"] = statistics.median(
                t["total_ms"] / r["total_ms"] for t, r in zip(runs["torchrun"], rs))
    print(f"\n# transformer {a.layers}x{a.width}, vocab {a.vocab} ({params / 1e6:.1f} M parameters), AdamW, "
          f"{RANKS} ranks, rank {VICTIM} killed at steps {steps} (seed {a.seed}), saves every {a.ckpt_every} "
          f"steps; medians of {a.rounds} rounds, torch {torch.__version__}")
    print(f"{'mode':<12} {'kill -> back at step K':>23} {'torchrun / mode':>16} {'steps lost':>12} "
          f"{'ranks after':>12}   parts (ms)")
    for m, r in out["modes"].items():
        parts = ", ".join(f"{k} {v:.0f}" for k, v in r["parts_ms"].items() if v is not None)
        ratio = f"{r['torchrun_over']:.1f}x" if "torchrun_over" in r else "-"
        print(f"{m:<12} {r['total_ms']:>20.0f} ms {ratio:>16} {str(r['lost_steps']):>12} {r['world_after']:>12}"
              f"   {parts}")
        if "recovery_ms" in r:
            print(f"{'':<12} the recovery itself (detection -> state rebuilt, resharded, ready): {r['recovery_ms']:.0f} "
                  f"ms (rounds: {', '.join(f'{v:.0f}' for v in r['recoveries_ms'])}; rank 0 kept "
                  f"{max(r['moved_mb']):.0f} MB of state by moving its pages)")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "shard_recovery.json"), "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
