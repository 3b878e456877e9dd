#!/usr/bin/python3
"""Calibration measurements for the SimGrid model of Sinew (hpc/sim/): runs Sinew on this machine and writes
one JSON file of raw medians. Nothing is fitted here; the simulator does the fitting.

The workload throughout is the one of hpc/bench/recovery_bench.py: Fashion-MNIST, MLP 784-512-512-10,
batch 64 per rank, SGD. Every program runs under $SINEW_MPIRUN with the flags of mpi_scripts/env.sh, one
after the other (the machine is small and noisy: no two measurements overlap). Sections of the JSON:

machine     os.cpu_count(), the first "model name" of /proc/cpuinfo, the MPI library (`ompi_info
            --version` next to mpirun, else `mpirun --version`), the mpirun command and flags, the date.
workload    data set, model, batch, and the parameter count P computed from the layer sizes; it must equal
            the "params" of sinew-train's start event (checked on every training run).
step        one sinew-train run (1 epoch of --limit-train samples, --log-every 1) per algorithm and rank
            count 2, 3, 4, plus one run at 1 rank (gradient_allreduce, no communication; stored under
            allreduce-mpi, whose options it has). From the metrics' step lines, the median over the steps
            after the first 20 (warm-up) of step_ms, comm_ms, exposed_comm_ms and bytes_sent_per_step;
            "steps" is how many steps the medians are over. workload.algorithm_options has the options.
compute     `sinew-bench train-step` at 1 rank (its mean step_ms and comm_ms; it reports no forward/backward
            split, so forward_backward is null), and `sinew-bench quantize --mib 4` at the trainer's
            quantisation chunk (--compress-chunk default 2048): encode/decode GB/s of the 8-bit codec.
allreduce   `sinew-bench allreduce --impl ring --min-bytes 4096 --iters 30` at 2, 3, 4 ranks: per message
            size, the time (ms) and bus bandwidth (GB/s) of Sinew's ring and of the library's MPI_Allreduce,
            both timed in the same run (mean of the iterations, the slowest rank's).
recovery    hpc/bench/recovery_bench.py --ranks K --rounds R at 3 and 4 ranks, its JSON as is (per mode:
            parts_ms, total_ms, totals_ms; spawn's grow_ms).
launch      wall time of `mpirun -n K sinew-bench quantize --help` (MPI_Init, print the options,
            MPI_Finalize: the cost of starting an MPI job) and of `mpirun -n K /bin/true` (mpirun without
            MPI) for K = 1..4, medians of R; the median of `sinew-bench load-data --reps 3` (reading and
            decoding the data set, timed inside the program) and the sizes of the data set's files.
checkpoint  per K = 3, 4: "load_ms", the restart mode's checkpoint load from the recovery section, and from a
            sinew-train run checkpointing every 10 steps: the checkpoint's payload ("bytes" of its
            checkpoint event), its size on disk (all files of one committed checkpoint), and the medians of
            the checkpoint events' write_ms and commit_ms.
p2p         not measured: sinew-bench has no point-to-point (ping-pong) benchmark.
contention  per section: its wall time, and the CPU time that other processes used meanwhile (the machine's
            busy time from /proc/stat minus that of this script and its children, os.times()), also as
            mean cores. Work of others inflates the figures of a section; the summary warns of it.
cpu         at the start and at the end: how long a fixed loop of Python takes alone ("alone_s", the
            median of 3) and how many cores' worth of it the machine gives when every core runs one
            ("cores_worth": cores x alone / the mean time with all running at once, median of 3). Load
            that /proc/stat does not show (a virtual machine's neighbours, a CPU quota) lowers them; the
            summary warns when fewer than CPU_SHORT of the cores were there. And what a fresh page of
            memory costs to fault in ("fault_us", microseconds, median of 3: writing a byte per page of
            FAULT_MIB MiB of fresh memory, less the same loop over the pages once there). On a virtual
            machine whose memory the host hands out lazily it is many times a bare machine's (12-16 us
            on 2026-12-03 here); the first step after a recovery (Open MPI's receive buffer on the new
            communicator), process start-up and data loading touch fresh memory. The model does not use
            these figures: they say why a calibration differs from another.

--quick is a smoke run: 1 round, 4096 training samples, 5 warm-up steps, shorter benchmarks. A failed run
stops the calibration with its output and a non-zero exit; nothing is written then.

usage: calibrate.py [--out FILE] [--rounds R] [--quick]   (FILE defaults to hpc/sim/calibration.json)
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DATASET = "fashion-mnist"
HIDDEN = [512, 512]
MODEL = "mlp:" + ",".join(map(str, HIDDEN))
INPUTS, CLASSES = 28 * 28, 10
BATCH = 64
QUANTIZE_CHUNK = 2048  # sinew-train's --compress-chunk default

# name -> sinew-train options (bytegrad as in hpc/bench/algorithms_bench.sh)
ALGORITHMS = {
    "allreduce-ring": ["--algorithm", "gradient_allreduce", "--allreduce", "ring"],
    "allreduce-mpi": ["--algorithm", "gradient_allreduce", "--allreduce", "mpi"],
    "bytegrad": ["--algorithm", "bytegrad", "--error-feedback", "true"],
    "decentralized": ["--algorithm", "decentralized", "--peer-selection", "shift_one"],
    "low-precision-decentralized": ["--algorithm", "low_precision_decentralized"],
}
STEP_RANKS = [2, 3, 4]
ALLREDUCE_RANKS = [2, 3, 4]
RECOVERY_RANKS = [3, 4]
LAUNCH_RANKS = [1, 2, 3, 4]
STEP_FIELDS = ["step_ms", "comm_ms", "exposed_comm_ms", "bytes_sent_per_step"]
CONTENDED_CORES = 0.1  # other processes' mean CPU use above which the summary warns
CPU_SHORT = 0.85       # the share of the cores' worth (cpu section) below which the summary warns
PROBE_LOOP = 3_000_000  # iterations of the cpu section's loop (0.1-0.3 s alone)
PROBE_CODE = ("import time\nt = time.perf_counter()\nx = 0\nfor i in range({n}):\n    x += i\n"
              "print(time.perf_counter() - t)")
FAULT_MIB = 64  # fresh anonymous memory the cpu section's page-fault probe writes a byte to per page
# The first pass over fresh pages (each one faulted in by the kernel) less the second (the same loop on
# pages already there), per page, in microseconds.
FAULT_CODE = ("import mmap, time\npage = mmap.PAGESIZE\nm = mmap.mmap(-1, {mib} << 20)\n"
              "def touch():\n    t = time.perf_counter()\n    for i in range(0, len(m), page):\n        m[i] = 1\n"
              "    return time.perf_counter() - t\n"
              "first = touch()\nprint((first - touch()) / (len(m) // page) * 1e6)")


class Settings:
    """What --quick changes."""

    def __init__(self, quick, rounds):
        self.quick = quick
        self.rounds = rounds if rounds is not None else (1 if quick else 3)
        self.limit_train = 4096 if quick else 16384
        self.warmup = 5 if quick else 20
        self.train_step_steps = 50 if quick else 300
        self.allreduce = ["--iters", "5", "--max-bytes", str(16 << 20)] if quick else ["--iters", "30"]


def parameter_count():
    """Weights and biases of the MLP INPUTS -> HIDDEN... -> CLASSES."""
    sizes = [INPUTS, *HIDDEN, CLASSES]
    return sum(n_in * n_out + n_out for n_in, n_out in zip(sizes, sizes[1:]))


def mpi_env():
    """($SINEW_MPIRUN, SINEW_MPIRUN_FLAGS, $SINEW_BUILD_DIR) from mpi_scripts/env.sh."""
    out = subprocess.run(["bash", "-c", f". {ROOT}/mpi_scripts/env.sh; echo $SINEW_MPIRUN; "
                          "printf '%s\\n' \"${SINEW_MPIRUN_FLAGS[@]}\"; echo $SINEW_BUILD_DIR"],
                         capture_output=True, text=True, check=True).stdout
    lines = out.rstrip("\n").split("\n")
    if not lines[0]:
        raise SystemExit("calibrate: mpi_scripts/env.sh found no mpirun")
    return lines[0], [f for f in lines[1:-1] if f], lines[-1]


def run(cmd, what, timeout=600):
    """Runs cmd; its stdout, or SystemExit with its output when it fails or times out."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"calibrate: {what} timed out after {timeout} s: {' '.join(cmd)}\n"
                         f"{tail(e.stdout)}{tail(e.stderr)}")
    if r.returncode != 0:
        raise SystemExit(f"calibrate: {what} failed (exit {r.returncode}): {' '.join(cmd)}\n"
                         f"{tail(r.stdout)}{tail(r.stderr)}")
    return r.stdout


def tail(text, chars=3000):
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-chars:]


def timed(cmd, what):
    t0 = time.perf_counter()
    run(cmd, what)
    return time.perf_counter() - t0


def events(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def table_row(stdout, header, what):
    """The numbers in the line after the line whose first word is `header` (sinew-bench's result tables)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.split()[:1] == [header]:
            return [float(v) for v in lines[i + 1].split()]
    raise SystemExit(f"calibrate: no '{header}' table in the output of {what}:\n{tail(stdout)}")


def median_of(values, what):
    if not values:
        raise SystemExit(f"calibrate: nothing to take the median of for {what}")
    return statistics.median(values)


class Calibration:
    def __init__(self, settings):
        self.s = settings
        self.mpirun, self.flags, build = mpi_env()
        self.train = f"{build}/apps/sinew-train"
        self.bench = f"{build}/apps/sinew-bench"
        for b in (self.train, self.bench):
            if not os.access(b, os.X_OK):
                raise SystemExit(f"calibrate: {b} is not an executable (run mpi_scripts/build.sh)")
        self.params = parameter_count()

    def mpi(self, n, *cmd):
        return [self.mpirun, *self.flags, "-n", str(n), *cmd]

    def training(self, ranks, options, d, what):
        """Runs sinew-train at `ranks` ranks on the workload; its metrics events, checked."""
        metrics = f"{d}/metrics.jsonl"
        run(self.mpi(ranks, self.train, "--dataset", DATASET, "--limit-train", str(self.s.limit_train),
                     "--limit-test", "1000", "--model", MODEL, "--epochs", "1", "--batch-size", str(BATCH),
                     "--progress", "false", "--log-every", "1", "--metrics", metrics, *options), what)
        ev = events(metrics)
        start = next((e for e in ev if e.get("event") == "start"), None)
        done = next((e for e in ev if e.get("event") == "done"), None)
        if start is None or done is None:
            raise SystemExit(f"calibrate: {what}: no start or done event in its metrics")
        if start["params"] != self.params:
            raise SystemExit(f"calibrate: {what}: sinew-train has {start['params']} parameters, the layer sizes "
                             f"give {self.params}")
        if start["world_size"] != ranks or done["failures"] != 0:
            raise SystemExit(f"calibrate: {what}: world size {start['world_size']}, {done['failures']} failures")
        return ev

    # --- sections ---------------------------------------------------------------------------------------

    def machine(self):
        model = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        ompi_info = os.path.join(os.path.dirname(self.mpirun), "ompi_info")
        if os.access(ompi_info, os.X_OK):
            version = run([ompi_info, "--version"], "ompi_info --version")
        else:
            version = run([self.mpirun, "--version"], "mpirun --version")
        return {"cores": os.cpu_count(), "cpu_model": model, "mpi_library": version.splitlines()[0].strip(),
                "mpirun": self.mpirun, "mpirun_flags": self.flags,
                "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}

    def workload(self):
        return {"dataset": DATASET, "model": MODEL, "batch": BATCH, "params": self.params,
                "limit_train": self.s.limit_train, "warmup_steps": self.s.warmup,
                "algorithm_options": {name: " ".join(options) for name, options in ALGORITHMS.items()}}

    def step_medians(self, ranks, options, what):
        with tempfile.TemporaryDirectory() as d:
            ev = self.training(ranks, options, d, what)
        steps = [e for e in ev if "event" not in e and "step_ms" in e and e["step"] > self.s.warmup]
        if len(steps) < 5:
            raise SystemExit(f"calibrate: {what}: only {len(steps)} steps after the {self.s.warmup} warm-up "
                             "steps")
        missing = [k for k in STEP_FIELDS if any(k not in e for e in steps)]
        if missing:
            raise SystemExit(f"calibrate: {what}: step lines without {', '.join(missing)}")
        return {**{k: statistics.median(e[k] for e in steps) for k in STEP_FIELDS}, "steps": len(steps)}

    def step(self):
        out = {name: {} for name in ALGORITHMS}
        progress("step: allreduce-mpi at 1 rank")
        out["allreduce-mpi"]["1"] = self.step_medians(1, ALGORITHMS["allreduce-mpi"], "1-rank training")
        for name, options in ALGORITHMS.items():
            for n in STEP_RANKS:
                progress(f"step: {name} at {n} ranks")
                out[name][str(n)] = self.step_medians(n, options, f"{name} training at {n} ranks")
        return out

    def compute(self):
        progress("compute: sinew-bench train-step, quantize")
        with tempfile.TemporaryDirectory() as d:
            run(self.mpi(1, self.bench, "train-step", "--model", MODEL, "--dataset", DATASET, "--batch-size",
                         str(BATCH), "--steps", str(self.s.train_step_steps), "--json", f"{d}/step.json"),
                "sinew-bench train-step")
            with open(f"{d}/step.json") as f:
                ts = json.load(f)
        what = "sinew-bench quantize"
        out = run(self.mpi(1, self.bench, "quantize", "--mib", "4", "--chunk", str(QUANTIZE_CHUNK)), what)
        encode, decode, ratio, _ = table_row(out, "encode_GB/s", what)
        return {"train_step_1rank": {"step_ms": ts["step_ms"], "comm_ms": ts["comm_ms"],
                                     "samples_per_s": ts["samples_per_s"], "steps": self.s.train_step_steps},
                "forward_backward": None,
                "quantize": {"mib": 4, "chunk": QUANTIZE_CHUNK, "bits": 8, "encode_gbs": encode,
                             "decode_gbs": decode, "wire_ratio": ratio}}

    def allreduce(self):
        out = {}
        for n in ALLREDUCE_RANKS:
            progress(f"allreduce: {n} ranks")
            with tempfile.TemporaryDirectory() as d:
                run(self.mpi(n, self.bench, "allreduce", "--impl", "ring", "--min-bytes", "4096",
                             *self.s.allreduce, "--json", f"{d}/ar.json"), f"sinew-bench allreduce at {n} ranks")
                with open(f"{d}/ar.json") as f:
                    rows = json.load(f)
            out[str(n)] = [{"bytes": r["bytes"],
                            "ring_ms": r["sinew_us"] / 1e3, "ring_busbw_gbs": r["sinew_busbw_gbs"],
                            "mpi_ms": r["mpi_us"] / 1e3, "mpi_busbw_gbs": r["mpi_busbw_gbs"]} for r in rows]
        return out

    def recovery(self):
        out = {}
        for n in RECOVERY_RANKS:
            progress(f"recovery: {n} ranks, {self.s.rounds} rounds")
            with tempfile.TemporaryDirectory() as d:
                run([f"{ROOT}/hpc/bench/recovery_bench.py", "--ranks", str(n), "--rounds",
                     str(self.s.rounds), "--json", f"{d}/recovery.json", "--png", f"{d}/recovery.png"],
                    f"recovery_bench.py at {n} ranks", timeout=900 * self.s.rounds)
                with open(f"{d}/recovery.json") as f:
                    out[str(n)] = json.load(f)
        return out

    def launch(self):
        progress("launch")
        out = {"mpi_init_exit_s": {}, "no_mpi_s": {},
               "mpi_program": "sinew-bench quantize --help (MPI_Init, prints the options, MPI_Finalize)",
               "no_mpi_program": "/bin/true"}
        for n in LAUNCH_RANKS:
            out["mpi_init_exit_s"][str(n)] = statistics.median(
                timed(self.mpi(n, self.bench, "quantize", "--help"), f"MPI launch at {n} ranks")
                for _ in range(self.s.rounds))
            out["no_mpi_s"][str(n)] = statistics.median(
                timed(self.mpi(n, "/bin/true"), f"launch of /bin/true at {n} ranks") for _ in range(self.s.rounds))
        what = "sinew-bench load-data"
        text = run(self.mpi(1, self.bench, "load-data", "--dataset", DATASET, "--reps", "3"), what)
        m = re.search(rf"{re.escape(DATASET)} from (.+?): \d+ train", text)
        if not m:
            raise SystemExit(f"calibrate: {what} did not say where the data set is:\n{tail(text)}")
        files = {f: os.path.getsize(os.path.join(m.group(1), f)) for f in sorted(os.listdir(m.group(1)))}
        out["load_data_s"] = table_row(text, "min_s", what)[1]  # min_s median_s max_s
        out["dataset_dir"] = m.group(1)
        out["dataset_files_bytes"] = files
        out["dataset_bytes"] = sum(files.values())
        return out

    def checkpoint(self, recovery):
        out = {}
        for n in RECOVERY_RANKS:
            progress(f"checkpoint: {n} ranks")
            with tempfile.TemporaryDirectory() as d:
                what = f"checkpointing training at {n} ranks"
                ev = self.training(n, ["--max-steps", "50", "--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every",
                                       "10"], d, what)
                ckpts = [e for e in ev if e.get("event") == "checkpoint"]
                if not ckpts:
                    raise SystemExit(f"calibrate: {what}: no checkpoint events")
                path = ckpts[-1]["path"]
                files = {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}
            out[str(n)] = {"load_ms": recovery[str(n)]["restart"]["parts_ms"]["checkpoint load"],
                           "payload_bytes": ckpts[-1]["bytes"], "disk_bytes": sum(files.values()),
                           "files_bytes": files,
                           "write_ms": median_of([e["write_ms"] for e in ckpts], what),
                           "commit_ms": median_of([e["commit_ms"] for e in ckpts], what),
                           "checkpoints": len(ckpts)}
        return out


class OtherLoad:
    """Measures, around a block, the CPU time of the processes other than this one and its children."""

    @staticmethod
    def machine_busy_s():
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def own_s():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def __enter__(self):
        self.t0, self.busy0, self.own0 = time.perf_counter(), self.machine_busy_s(), self.own_s()
        return self

    def __exit__(self, *exc):
        wall = time.perf_counter() - self.t0
        other = max(0.0, self.machine_busy_s() - self.busy0 - (self.own_s() - self.own0))
        self.result = {"wall_s": wall, "other_cpu_s": other, "other_cores": other / wall}
        return False


def cpu_probe(cores):
    """The cpu section's figures (see the module's doc): the loop alone, then on every core at once."""
    cmd = [sys.executable, "-c", PROBE_CODE.format(n=PROBE_LOOP)]

    def loops(k):
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(k)]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            raise SystemExit("calibrate: the cpu probe's Python loop failed")
        return [float(o) for o in outs]

    alone = statistics.median(loops(1)[0] for _ in range(3))
    together = statistics.median(statistics.mean(loops(cores)) for _ in range(3))
    fault = statistics.median(float(run([sys.executable, "-c", FAULT_CODE.format(mib=FAULT_MIB)],
                                        "the page-fault probe")) for _ in range(3))
    return {"alone_s": alone, "cores_worth": min(float(cores), cores * alone / together), "fault_us": fault}


def cpu_lines(cpu, cores):
    """The cpu section in words, with a warning when the machine was short of CPU (also sim.py check's)."""
    lines = [f"cpu: a Python loop alone {cpu['start']['alone_s'] * 1e3:.0f} ms at the start, "
             f"{cpu['end']['alone_s'] * 1e3:.0f} ms at the end; all {cores} cores running it gave "
             f"{cpu['start']['cores_worth']:.2f} and {cpu['end']['cores_worth']:.2f} cores' worth"]
    if "fault_us" in cpu["start"]:  # calibrations before 2026-12-03 afternoon have no page-fault probe
        lines.append(f"memory: a fresh page cost {cpu['start']['fault_us']:.1f} us to fault in at the start, "
                     f"{cpu['end']['fault_us']:.1f} us at the end (the first step after a recovery, process "
                     "start-up and data loading touch fresh memory)")
    short = min(cpu["start"]["cores_worth"], cpu["end"]["cores_worth"])
    if short < CPU_SHORT * cores:
        lines.append(f"WARNING: the machine gave {short:.2f} of its {cores} cores (a CPU quota or busy neighbours): "
                     "3 and 4 ranks are slowed unevenly, and the check's predictions at 4 ranks may miss")
    return lines


def progress(text):
    print(f"== {text}", file=sys.stderr, flush=True)


def summary(c):
    w, m = c["workload"], c["machine"]
    lines = [f"# Sinew calibration, {m['date']}: {m['cores']} cores ({m['cpu_model']}), {m['mpi_library']}; "
             f"{w['model']} ({w['params']} parameters), batch {w['batch']}; {c['duration_s']:.0f} s",
             "step_ms (exposed comm ms), medians after the warm-up steps:",
             f"{'':>28}" + "".join(f"{n + ' ranks':>16}" for n in ["1", *map(str, STEP_RANKS)])]
    for name, by_ranks in c["step"].items():
        cells = [f"{by_ranks[n]['step_ms']:7.2f} ({by_ranks[n]['exposed_comm_ms']:5.2f})" if n in by_ranks
                 else "-" for n in ["1", *map(str, STEP_RANKS)]]
        lines.append(f"{name:>28}" + "".join(f"{cell:>16}" for cell in cells))
    one, q = c["compute"]["train_step_1rank"], c["compute"]["quantize"]
    lines.append(f"compute: sinew-bench train-step at 1 rank {one['step_ms']:.2f} ms; "
                 f"8-bit quantize encode {q['encode_gbs']:.1f} GB/s, decode {q['decode_gbs']:.1f} GB/s")
    size = 4 * w["params"]
    for n, rows in c["allreduce"].items():
        r = min(rows, key=lambda row: abs(row["bytes"] - size))
        lines.append(f"allreduce {n} ranks, {r['bytes']} B (nearest to the gradient's {size} B): ring "
                     f"{r['ring_ms']:.2f} ms, MPI_Allreduce {r['mpi_ms']:.2f} ms")
    for n, rec in c["recovery"].items():
        lines.append(f"recovery {n} ranks, total ms: " + ", ".join(
            f"{mode} {rec[mode]['total_ms']:.0f}" for mode in ("in place", "spare", "spawn", "restart")))
    la = c["launch"]
    lines.append("launch (s) by ranks, MPI init+exit: "
                 + ", ".join(f"{n}: {t:.2f}" for n, t in la["mpi_init_exit_s"].items())
                 + "; /bin/true: " + ", ".join(f"{n}: {t:.2f}" for n, t in la["no_mpi_s"].items()))
    lines.append(f"data loading {la['load_data_s']:.3f} s ({la['dataset_bytes']} bytes of files)")
    for n, ck in c["checkpoint"].items():
        lines.append(f"checkpoint {n} ranks: {ck['disk_bytes']} bytes on disk ({ck['payload_bytes']} payload), "
                     f"write {ck['write_ms']:.1f} ms, commit {ck['commit_ms']:.1f} ms, "
                     f"load {ck['load_ms']:.1f} ms")
    lines += cpu_lines(c["cpu"], m["cores"])
    lines.append("other processes' CPU use, mean cores: " + ", ".join(
        f"{name} {u['other_cores']:.2f}" for name, u in c["contention"].items()))
    busy = [name for name, u in c["contention"].items() if u["other_cores"] > CONTENDED_CORES]
    if busy:
        lines.append(f"WARNING: other work ran on the machine during {', '.join(busy)}: those figures are "
                     "inflated")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "hpc/sim/calibration.json"))
    ap.add_argument("--rounds", type=int, help="rounds of the repeated measurements (default 3, --quick 1)")
    ap.add_argument("--quick", action="store_true", help="a fast smoke run: fewer rounds and steps")
    a = ap.parse_args()
    if a.rounds is not None and a.rounds < 1:
        ap.error("--rounds must be at least 1")
    t0 = time.perf_counter()
    cal = Calibration(Settings(a.quick, a.rounds))
    c = {"machine": cal.machine(), "workload": cal.workload(), "rounds": cal.s.rounds, "quick": a.quick}
    progress("cpu probe")
    c["cpu"] = {"start": cpu_probe(c["machine"]["cores"])}
    sections = {"step": cal.step, "compute": cal.compute, "allreduce": cal.allreduce, "recovery": cal.recovery,
                "launch": cal.launch, "checkpoint": lambda: cal.checkpoint(c["recovery"])}
    contention = {}
    for name, measure in sections.items():
        with OtherLoad() as load:
            c[name] = measure()
        contention[name] = load.result
    c["contention"] = contention
    progress("cpu probe")
    c["cpu"]["end"] = cpu_probe(c["machine"]["cores"])
    c["notes"] = {
        "step": "medians over the steps after workload.warmup_steps; the 1-rank run is gradient_allreduce "
                "(no communication), stored under allreduce-mpi",
        "compute": "sinew-bench train-step gives no forward/backward split: only the 1-rank step",
        "allreduce": "sinew-bench allreduce --impl ring: ring = Sinew's ring, mpi = plain MPI_Allreduce, "
                     "each the mean over the iterations of the slowest rank",
        "p2p": "not measured: sinew-bench has no point-to-point benchmark",
        "launch": "wall time of the whole mpirun command",
    }
    c["duration_s"] = time.perf_counter() - t0
    out = os.path.abspath(a.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out + ".tmp", "w") as f:
        json.dump(c, f, indent=1)
        f.write("\n")
    os.replace(out + ".tmp", out)
    print(summary(c))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
