#!/usr/bin/python3
"""Chaos driver: seeded, randomized compound failures against in-place recovery (issue 11, item 7).

Each trial is a short Fashion-MNIST sinew-train job under Open MPI with ULFM (4 ranks, 6 for the 3-of-6
pattern) with 1-3 ranks killed, rank 0 included:

  inject     --inject-fault RANK:POINT:STEP at a named point (forward, backward, allreduce, optimizer,
             recovery, spawn, the checkpoint writer's points; src/sinew/core/fault.hpp);
  external   kill -9 of a launch rank's pid from here, at a step, or a small random delay after an earlier
             kill (simultaneous, during the recovery, during the spawn of a replacement).

The algorithm (one of the CPU ones that recover in place, or of --algorithms), checkpoints and growth are
drawn at random too, and so are hot spares: a trial with growth draws K from --spares (default 0,1,2) and
launches N+K processes with `--spares K`; the last K launch ranks (N..N+K-1) wait as idle spares and
replace failed members (promoted, no spawn) until they are used up, then replacements are spawned. The
kills target members (launch ranks < N), with two spare variants: an idle spare killed with kill -9
before any failure (idle-spare), and a later kill of the spare that the first failure promoted
(promoted-spare). A kill during the spawn is only drawn where a spawn will happen, i.e. once more members
are lost than spares are left. The plan of a trial depends only on --seed, its number, --algorithms and
--spares, and is printed, so `--only K` replays one trial (the summary prints the replay command); K is
drawn from a stream of its own, so that `--spares 0` gives the plans of the driver before spares.

Link cuts (--link-cuts P, default 0.1): with probability P (a stream of its own, so `--link-cuts 0` gives
the plans of the driver before them) a trial's first member kill becomes a cut of that member's data link
on the shaped test bed (hpc/net/, one host per launch rank, brought up by the driver; needs root): the
process stays alive, unreachable, and must be excluded by the failure detector (it fences itself after
--stall-timeout-ms, 10 s) while the others go on. Kills drawn relative to a cut count their delay from
the exclusion (the cut plus 10 s), so that "during recovery" still means during the recovery.

Node losses (--node-loss P, default 0.15), killed mpiruns (--launcher-kills, 0.05) and kills of a
joining replacement or of the spawning root (--join-kills, 0.5) come from streams of their own too. A
node-loss trial runs 8 ranks on 4 bed hosts (2 each) and loses one of hosts 2-4 at a step (testbed.sh
lose: links dark, its ranks and PRRTE daemon killed, its /dev/shm emptied); a killed-mpirun trial kills
mpirun at a step; either may add a kill of a rank of the relaunch while it starts (during-relaunch).

Every job runs under the supervisor (mpi_scripts/sinew-run): in place when it can, relaunched when it
cannot. A trial passes when the supervisor exits 0 before the deadline, the `done` event is written, the
test accuracy is at most --tolerance points below a failure-free reference run of the same configuration
(run once per configuration and sinew-train binary, cached in --out; hot spares, checkpoints and growth
do not change the training, so the reference is keyed by size and algorithm only), the exactly-once audit
(mpi_scripts/check-audit.py) holds, and, with a spare left at the first failure and the job in place, that
failure was replaced by a spare (spare-unused otherwise). Its outcome is "in place" (one launch),
"fallback" (relaunched; with the time from the first kill until training was back at the failed step) or
"wrong". A wrong trial is classified from its exit status, metrics and output (hang before/after done,
nonzero exit after or before done, no done, accuracy, audit, spare-unused, and for a job without done the
spawn watchdog's abort or a rank exiting on an error), with the evidence lines; in a trial that ended
right those last ones are remarks, counted in the summary.

Patterns live in one registry (PATTERNS): a relation pattern draws a further kill relative to an earlier
one; a tag pattern only classifies plans.

usage: chaos.py [--trials N] [--seed S] [--only K[,K...]] [--patterns P,...] [--algorithms A,...]
                [--spares K,...] [--link-cuts P] [--node-loss P] [--launcher-kills P] [--join-kills P]
                [--deadline S] [--out DIR] [--json FILE] [--train BIN] [--dry-run]
                [--rejudge RESULTS]
       (run from the repository root with /usr/bin/python3; exit 0 all passed, 1 some failed,
       77 ULFM or Fashion-MNIST missing)
"""
import argparse
import atexit
import dataclasses
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"

# The job of every trial. 3 epochs of 8192 samples at 4 x 64 is 96 steps; with the start-up (data
# loading on 2 cores) a failure-free trial takes about 15 s, one with a spawned replacement about 20-25 s.
LIMIT_TRAIN = 8192
LIMIT_TEST = 2000
EPOCHS = 3
BATCH = 64
STEP_SLEEP_MS = 20  # so that external kills land mid-run
CHECKPOINT_EVERY = 20
TIMEOUT_MS = 15000  # deadline of every collective (and of the spawn watchdog)
STALL_S = 10.0  # sinew-train's default --stall-timeout-ms: a cut-off process is excluded this long after the cut
SLOTS = 2  # node-loss trials: ranks per bed host (4 hosts x 2 ranks)
NODE_HOSTS = 4
NET = os.path.join(ROOT, "hpc/net")

TRAIN_POINTS = ["forward", "backward", "allreduce", "optimizer"]
CHECKPOINT_POINTS = ["before-shard-data", "after-shard-data", "before-fsync", "before-manifest",
                     "before-commit"]
COMMIT_POINTS = {"before-manifest", "before-commit"}  # only on the committing rank (view rank 0)

# CPU algorithms with an in-place recovery scenario (tests/cli/elastic_scenarios.sh algo-*), with the
# options those scenarios use. `auto` is left out: its choice depends on timing, so its reference would not
# be the same configuration.
ALGORITHMS = {
    "gradient_allreduce": [],
    "ring": ["--algorithm", "gradient_allreduce", "--allreduce", "ring"],
    "bytegrad": ["--algorithm", "bytegrad", "--error-feedback", "true"],
    "qadam": ["--algorithm", "qadam", "--optimizer", "adam", "--qadam-warmup-steps", "30", "--lr", "0.002"],
    "decentralized": ["--algorithm", "decentralized", "--peer-selection", "shift_one"],
    "low_precision_decentralized": ["--algorithm", "low_precision_decentralized"],
    "async": ["--algorithm", "async"],
}
# Drawn only when --algorithms names them (so that the default draw, and the plans of every earlier seed,
# stay as they were): the optimiser state sharded with two holders per shard (--shard optimizer; with
# sharded gradients too, --shard gradients, exact or with bytegrad). A trial
# that kills both holders of a shard ends in the relaunch from the newest checkpoint, a fallback.
SHARDED = {
    "sharded": ["--shard", "optimizer", "--shard-replicas", "2", "--optimizer", "adam", "--lr", "0.002"],
    "sharded-bytegrad": ["--algorithm", "bytegrad", "--error-feedback", "true", "--shard", "optimizer",
                         "--optimizer", "adam", "--lr", "0.002"],
    "sharded-gradients": ["--shard", "gradients", "--shard-replicas", "2", "--optimizer", "adam", "--lr", "0.002"],
    "sharded-gradients-bytegrad": ["--algorithm", "bytegrad", "--shard", "gradients", "--shard-replicas", "2",
                                   "--optimizer", "adam", "--lr", "0.002"],
}
ALGORITHMS_ALL = {**ALGORITHMS, **SHARDED}


@dataclasses.dataclass
class Kill:
    """One planned kill. `how` is inject (--inject-fault), external (kill -9 from the driver), link (the
    rank's host loses its data link on the test bed, at metrics step `step`), node (host number `rank` of
    the bed is lost: links dark, every process on it killed, its /dev/shm emptied), launcher (kill -9 of
    mpirun), replacement (kill -9 of the first process spawned after kill `after`, `delay_s` after it
    appeared: while it starts or joins) or relaunch (kill -9 of launch rank `rank` of the supervisor's
    first relaunch, `delay_s` after that launch began). An external kill with `after` set fires `delay_s`
    after kill number `after` of the trial (after its exclusion, for a link cut); without, at metrics step
    `step`."""
    rank: int
    how: str
    relation: str  # the pattern that drew it: first, sequential, simultaneous, during-recovery, ...
    step: int = 0
    point: str = ""
    after: int = -1
    delay_s: float = 0.0

    def spec(self):
        return f"{self.rank}:{self.point}:{self.step}"

    def describe(self):
        if self.how == "inject":
            return f"inject {self.spec()}"
        if self.how == "link":
            return f"cut r{self.rank}'s link at step {self.step}"
        if self.how == "node":
            if self.after >= 0:
                return f"lose host {self.rank} {1000 * self.delay_s:.0f}ms after #{self.after + 1}"
            return f"lose host {self.rank} at step {self.step}"
        if self.how == "launcher":
            return f"kill -9 mpirun at step {self.step}"
        if self.how == "replacement":
            return f"kill -9 the spawned replacement {1000 * self.delay_s:.0f}ms after it appears (after #{self.after + 1})"
        if self.how == "relaunch":
            return f"kill -9 r{self.rank} of the relaunch {1000 * self.delay_s:.0f}ms after it starts"
        if self.after >= 0:
            return f"kill -9 r{self.rank} {1000 * self.delay_s:.0f}ms after #{self.after + 1}"
        if self.relation == "idle-spare":
            return f"kill -9 idle spare r{self.rank} at step {self.step}"
        return f"kill -9 r{self.rank} at step {self.step}"


@dataclasses.dataclass
class Plan:
    index: int
    n: int
    algorithm: str
    checkpoints: bool
    grow: bool
    kills: list
    spares: int = 0  # hot spares (--spares K, launch ranks n..n+K-1); only with growth
    hosts: int = 0  # node-loss trials: the bed's hosts, SLOTS ranks each (0: one host per rank, or no bed)

    def procs(self):
        """Processes mpirun launches: the members and the spares."""
        return self.n + self.spares

    def on_bed(self):
        """Whether the trial runs on the shaped test bed (it cuts a link or loses a host)."""
        return any(k.how in ("link", "node") for k in self.kills)

    def bed_hosts(self):
        """Hosts of the bed this trial uses, and ranks per host."""
        return (self.hosts, SLOTS) if self.hosts else (self.procs(), 1)

    def member_kills(self):
        """The kills of members (a promoted spare is a member): all but an idle spare's."""
        return [k for k in self.kills if k.relation != "idle-spare"]

    def fallback_expected(self):
        """Whether the plan ends the first launch for sure (a lost node, a killed mpirun): the supervisor's
        relaunch must follow."""
        return any(k.how in ("node", "launcher") for k in self.kills)

    def spares_left(self):
        """Spares that can replace members: those not killed while idle."""
        return self.spares - (len(self.kills) - len(self.member_kills()))

    def steps(self):
        """Steps of the failure-free run (more after a shrink)."""
        per_epoch = -(-LIMIT_TRAIN // (self.n * BATCH))
        return EPOCHS * per_epoch

    def reference_key(self):
        """What the failure-free reference depends on: checkpoints, growth and hot spares do not change
        training (a spare takes the state from the members' memory), so they are not part of it."""
        return f"n{self.n}-{self.algorithm}"

    def options(self, d):
        o = ["--dataset", "fashion-mnist", "--limit-train", str(LIMIT_TRAIN), "--limit-test", str(LIMIT_TEST),
             "--model", "mlp:64", "--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--progress", "false",
             "--log-every", "1", "--step-sleep-ms", str(STEP_SLEEP_MS), "--timeout-ms", str(TIMEOUT_MS),
             "--metrics", f"{d}/metrics.jsonl", "--audit-dir", f"{d}/audit",
             "--grow", "true" if self.grow else "false", *ALGORITHMS_ALL[self.algorithm]]
        if self.checkpoints:
            o += ["--checkpoint-dir", f"{d}/ckpt", "--checkpoint-every", str(CHECKPOINT_EVERY)]
        if self.spares:
            o += ["--spares", str(self.spares)]
        for k in self.kills:
            if k.how == "inject":
                o += ["--inject-fault", k.spec()]
        return o

    def describe(self):
        kills = "; ".join(k.describe() for k in self.kills) or "none"
        return (f"n={self.n}{f' on {self.hosts}x{SLOTS}' if self.hosts else ''} algo={self.algorithm} "
                f"ckpt={'on' if self.checkpoints else 'off'} "
                f"grow={'on' if self.grow else 'off'} spares={self.spares} kills=[{kills}]")


# ---- the pattern registry -------------------------------------------------------------------------------
# A relation pattern draws the next kill from the previous one (`draw`); a tag pattern classifies a plan
# (`matches`). `available` False: registered so that the summary shows it, never drawn (the trainer lacks
# the feature). To add one: write draw or matches, append a Pattern.


def _free_rank(rng, plan):
    taken = {k.rank for k in plan.kills}
    return rng.choice([r for r in range(plan.n) if r not in taken])


def _training_step(rng, plan, lo):
    hi = int(0.8 * plan.steps())
    return rng.randint(min(lo, hi), hi)


def spawn_follows(plan):
    """Whether the recovery from the kills so far spawns: growth on and more members lost than spares."""
    return plan.grow and len(plan.member_kills()) > plan.spares_left()


def draw_idle_spare(rng, plan, first):
    """kill -9 of an idle spare from outside, a few steps before the first member kill (no failure yet)."""
    return Kill(rng.randrange(plan.n, plan.procs()), "external", "idle-spare",
                step=rng.randint(2, max(2, first.step - 4)))


def draw_first(rng, plan, prev):
    """A kill at a step: a named training or checkpoint point, or kill -9 from outside."""
    return _draw_at_step(rng, plan, 8, "first")


def _promoted_spare(plan):
    """The spare that the first member failure promoted: the lowest launch rank among the spares not killed
    while idle (the pool promotes in launch order); None without one, or if it is killed already."""
    idle = {k.rank for k in plan.kills if k.relation == "idle-spare"}
    alive = [r for r in range(plan.n, plan.procs()) if r not in idle]
    if not alive or any(k.rank == alive[0] for k in plan.member_kills()):
        return None
    return alive[0]


def draw_sequential(rng, plan, prev):
    """A later kill at a step of its own, after the previous recovery; with hot spares sometimes the spare
    that replaced the first failed member (a member itself by then)."""
    spare = _promoted_spare(plan) if plan.spares else None  # no draw without spares: older plans stay
    if spare is not None and rng.random() < 0.35:
        step = _training_step(rng, plan, prev.step + 8)
        if rng.random() < 0.3:
            return Kill(spare, "external", "sequential", step=step)
        return Kill(spare, "inject", "sequential", step=step, point=rng.choice(TRAIN_POINTS))
    return _draw_at_step(rng, plan, prev.step + 8, "sequential")


def _draw_at_step(rng, plan, lo, relation):
    rank = _free_rank(rng, plan)
    step = _training_step(rng, plan, lo)
    roll = rng.random()
    if roll < 0.3:
        return Kill(rank, "external", relation, step=step)
    if plan.checkpoints and roll < 0.45:
        ckpts = [s for s in range(CHECKPOINT_EVERY, int(0.8 * plan.steps()) + 1, CHECKPOINT_EVERY) if s >= lo]
        if ckpts:
            point = rng.choice(CHECKPOINT_POINTS)
            if point in COMMIT_POINTS:  # fires only on view rank 0: the lowest launch rank still alive
                alive = [r for r in range(plan.n) if r not in {k.rank for k in plan.kills}]
                rank = alive[0]
            return Kill(rank, "inject", relation, step=rng.choice(ckpts), point=point)
    return Kill(rank, "inject", relation, step=step, point=rng.choice(TRAIN_POINTS))


def draw_simultaneous(rng, plan, prev):
    """Another rank dies at the same moment: the same point of the same step, or kill -9 0-10 ms later."""
    rank = _free_rank(rng, plan)
    if prev.how == "inject" and prev.point in TRAIN_POINTS and rng.random() < 0.5:
        return Kill(rank, "inject", "simultaneous", step=prev.step, point=prev.point)
    return Kill(rank, "external", "simultaneous", step=prev.step, after=plan.kills.index(prev),
                delay_s=round(rng.uniform(0.0, 0.010), 4))


def draw_during_recovery(rng, plan, prev):
    """A survivor dies while the others recover: at the recovery point, or kill -9 10-40 ms after the
    previous kill (detection takes ~17 ms, revoke/shrink/agree a few ms, docs/fault-tolerance.md)."""
    rank = _free_rank(rng, plan)
    if rng.random() < 0.5:
        return Kill(rank, "inject", "during-recovery", step=prev.step, point="recovery")
    return Kill(rank, "external", "during-recovery", step=prev.step, after=plan.kills.index(prev),
                delay_s=round(rng.uniform(0.010, 0.040), 4))


def draw_during_spawn(rng, plan, prev):
    """A member dies while the group spawns a replacement: at the spawn point, or kill -9 0.3-2.5 s after the
    previous kill (the spawn and the newcomer's data loading take ~3.5 s on this machine). Only drawn once
    the hot spares are used up (spawn_follows): a spare's promotion does not go through the spawn point."""
    rank = _free_rank(rng, plan)
    if rng.random() < 0.5:
        return Kill(rank, "inject", "during-spawn", step=prev.step, point="spawn")
    return Kill(rank, "external", "during-spawn", step=prev.step, after=plan.kills.index(prev),
                delay_s=round(rng.uniform(0.3, 2.5), 3))


@dataclasses.dataclass
class Pattern:
    name: str
    summary: str
    available: bool = True
    draw: object = None  # relation pattern: (rng, plan, previous kill) -> Kill
    weight: float = 1.0  # relative chance among the relation patterns that apply
    applies: object = None  # relation pattern: plan -> whether it can be drawn for this plan
    matches: object = None  # tag pattern: plan -> bool (relation patterns match by the kills' relation)

    def in_plan(self, plan):
        if self.matches:
            return self.matches(plan)
        return any(k.relation == self.name for k in plan.kills)


PATTERNS = [
    Pattern("single", "one member killed only", matches=lambda plan: len(plan.member_kills()) == 1),
    Pattern("sequential", "kills at separate steps", draw=draw_sequential,
            applies=lambda plan: plan.kills[-1].step + 8 <= int(0.8 * plan.steps())),
    Pattern("simultaneous", "two ranks die at once", draw=draw_simultaneous),
    Pattern("during-recovery", "a survivor dies during the recovery", draw=draw_during_recovery),
    Pattern("during-spawn", "a member dies during the spawn of a replacement", draw=draw_during_spawn,
            applies=spawn_follows),
    Pattern("rank0", "launch rank 0 killed", matches=lambda plan: any(k.rank == 0 for k in plan.kills)),
    Pattern("external", "a kill -9 from outside", matches=lambda plan: any(k.how == "external" for k in plan.kills)),
    Pattern("checkpoint", "killed inside the checkpoint writer",
            matches=lambda plan: any(k.point in CHECKPOINT_POINTS for k in plan.kills)),
    Pattern("3-of-6", "3 of 6 ranks killed", matches=lambda plan: plan.n == 6),
    Pattern("grow", "replacements spawned", matches=lambda plan: plan.grow),
    Pattern("spares", "hot spares (--spares K) replace failed members", matches=lambda plan: plan.spares > 0),
    Pattern("spares-exhausted", "more members lost than spares: the rest spawned",
            matches=lambda plan: plan.spares > 0 and spawn_follows(plan)),
    Pattern("idle-spare", "an idle spare killed (kill -9) before any failure"),  # drawn by make_plan
    Pattern("promoted-spare", "the spare promoted by the first failure killed later",
            matches=lambda plan: any(k.rank >= plan.n and k.relation != "idle-spare" for k in plan.kills)),
    Pattern("link-cuts", "a member's data link cut on the test bed",
            matches=lambda plan: any(k.how == "link" for k in plan.kills)),
    # Drawn by make_plan from streams of their own (--node-loss, --launcher-kills, --join-kills):
    Pattern("node-loss", f"a bed host lost ({NODE_HOSTS} hosts x {SLOTS} ranks): ranks, daemon, its /dev/shm",
            matches=lambda plan: any(k.how == "node" for k in plan.kills)),
    Pattern("node-loss-in-recovery", "a bed host lost 10-40 ms after a rank on another host died"),
    Pattern("killed-mpirun", "mpirun killed with kill -9"),
    Pattern("during-relaunch", "a rank of the supervisor's relaunch killed while it starts"),
    Pattern("replacement-join", "the replacement (spawned or a promoted spare) killed while it joins"),
    Pattern("spawn-root", "the spawning root (view rank 0) killed during the spawn"),
    Pattern("fallback", "a relaunch by the supervisor was needed",
            matches=lambda plan: plan.fallback_expected()),
]


def draw_join_kill(rng, plan):
    """A kill of the replacement while it joins, or of the spawning root during the spawn, relative to the
    first member kill; None where the plan has neither a replacement nor a spawn after it."""
    first = plan.member_kills()[0]
    i = plan.kills.index(first)
    taken = {k.rank for k in plan.kills}
    spare = _promoted_spare(plan) if plan.spares_left() > 0 else None
    if spare is not None and spare not in taken:  # the spare that the first failure promotes
        return Kill(spare, "external", "replacement-join", after=i, delay_s=round(rng.uniform(0.005, 0.15), 4))
    if not plan.grow or plan.spares_left() > 0:
        return None
    if rng.random() < 0.5:
        return Kill(-1, "replacement", "replacement-join", after=i, delay_s=round(rng.uniform(0.0, 1.5), 3))
    alive = [r for r in range(plan.n) if r not in taken]
    if len(alive) < 2:
        return None
    if first.how == "inject" and rng.random() < 0.5:  # at the spawn point: right before MPI_Comm_spawn
        return Kill(alive[0], "inject", "spawn-root", step=first.step, point="spawn")
    return Kill(alive[0], "external", "spawn-root", after=i, delay_s=round(rng.uniform(0.3, 2.0), 3))


def make_plan(seed, index, algorithms=None, spares=(0, 1, 2), link_cuts=0.0, node_loss=0.0, launcher_kills=0.0,
              join_kills=0.0, recovery_node_loss=0.0):
    """The plan of trial `index`: a function of (seed, index, algorithms, spares, link_cuts, node_loss,
    launcher_kills, join_kills) only, so that one trial can be replayed. The hot spares (and an idle spare's
    kill), the link cuts, the node losses, the mpirun kills and the join kills come from streams of their
    own: with `spares` (0,) and the chances 0 the plans are those of the driver before them.

    A node-loss trial runs 8 ranks on 4 bed hosts and loses one of hosts 2-4 (host 1 runs mpirun; its loss
    is the killed-mpirun pattern) at a step; a killed-mpirun trial kills mpirun at a step. Both end the
    launch: the supervisor relaunches. Either may add a kill of a rank of that relaunch while it starts."""
    rng = random.Random(f"sinew-chaos:{seed}:{index}")
    srng = random.Random(f"sinew-chaos-spares:{seed}:{index}")
    n = 6 if rng.random() < 0.12 else 4
    plan = Plan(index, n, rng.choice(sorted(algorithms or ALGORITHMS)), rng.random() < 0.5, rng.random() < 0.5,
                [])
    plan.spares = srng.choice(sorted(spares)) if plan.grow else 0  # --spares needs --grow true
    count = 3 if n == 6 else rng.choices([1, 2, 3], weights=[1, 2, 1])[0]
    # An idle spare killed first (its step is drawn once the first member kill's is known): it comes
    # before the member kills in the list, so that plan.kills[-1] is the last member kill.
    idle = plan.spares > 0 and srng.random() < 0.3
    if idle:
        plan.kills.append(Kill(-1, "external", "idle-spare"))
    first = draw_first(rng, plan, None)
    if idle:
        plan.kills[0] = draw_idle_spare(srng, plan, first)
    plan.kills.append(first)
    while len(plan.member_kills()) < count:
        prev = plan.kills[-1]
        relations = [p for p in PATTERNS if p.available and p.draw and (p.applies is None or p.applies(plan))]
        pattern = rng.choices(relations, weights=[p.weight for p in relations])[0]
        plan.kills.append(pattern.draw(rng, plan, prev))
    if random.Random(f"sinew-chaos-links:{seed}:{index}").random() < link_cuts:
        i = plan.kills.index(first)
        plan.kills[i] = Kill(first.rank, "link", "link-cut", step=first.step)
    elif join_kills and len(plan.member_kills()) <= 2:
        jrng = random.Random(f"sinew-chaos-join:{seed}:{index}")
        if jrng.random() < join_kills:
            k = draw_join_kill(jrng, plan)
            if k is not None:
                plan.kills.append(k)
    nrng = random.Random(f"sinew-chaos-nodes:{seed}:{index}")
    roll = nrng.random()
    if roll < node_loss + launcher_kills:
        plan.spares, plan.kills = 0, []
        if roll < node_loss:
            plan.n, plan.hosts = NODE_HOSTS * SLOTS, NODE_HOSTS
            plan.kills.append(Kill(nrng.randint(2, NODE_HOSTS), "node", "node-loss",
                                   step=_training_step(nrng, plan, 8)))
            # A stream of its own (default off), so that the plans above stay those of the runs documented:
            # a rank on another host dies first, and the node is lost 10-40 ms later, during the recovery.
            rrng = random.Random(f"sinew-chaos-recovery-nodes:{seed}:{index}")
            if rrng.random() < recovery_node_loss:
                lost = plan.kills[0]
                rank = rrng.choice([r for r in range(plan.n) if r // SLOTS != lost.rank - 1])
                plan.kills = [Kill(rank, "external", "first", step=lost.step),
                              Kill(lost.rank, "node", "node-loss-in-recovery", after=0,
                                   delay_s=round(rrng.uniform(0.010, 0.040), 4))]
        else:
            plan.kills.append(Kill(-1, "launcher", "killed-mpirun", step=_training_step(nrng, plan, 8)))
        if nrng.random() < 0.35:  # the relaunch has fewer ranks after a node loss: rank 0..3 exists in both
            plan.kills.append(Kill(nrng.randrange(4), "relaunch", "during-relaunch",
                                   delay_s=round(nrng.uniform(0.2, 3.0), 3)))
    return plan


# ---- running a trial ------------------------------------------------------------------------------------


def mpi_env():
    """SINEW_MPIRUN and its flags from mpi_scripts/env.sh, and whether it is the ULFM Open MPI."""
    out = subprocess.run(["bash", "-c", f". {ROOT}/mpi_scripts/env.sh; echo \"$SINEW_MPI_PREFIX\"; "
                          "echo \"$SINEW_MPIRUN\"; printf '%s\\n' \"${SINEW_MPIRUN_FLAGS[@]}\""],
                         capture_output=True, text=True, check=True, timeout=30).stdout.split("\n")
    prefix, mpirun, flags = out[0], out[1], [f for f in out[2:] if f]
    return mpirun, flags, mpirun == os.path.join(prefix, "bin/mpirun") and "ulfm" in flags


def procs_of(d):
    """Pids of processes whose command line mentions the trial directory (sinew-train and its spawns)."""
    pids = []
    for p in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(p, "rb") as f:
                if d.encode() in f.read():
                    pids.append(int(p.split("/")[2]))
        except OSError:  # the process ended while we looked
            continue
    return [p for p in pids if p != os.getpid()]


def kill9(pid):
    """SIGKILL, for a process of the job that may have exited since it was listed."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended on its own in between: nothing left to stop


def launch_rank(pid, generation=False):
    """The launch rank of a process started by mpirun and its world's size (a spawned process has a world
    of its own); with `generation`, also the supervisor's launch it belongs to. None if unknown."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    except OSError:
        return None
    if b"OMPI_COMM_WORLD_RANK" not in env:
        return None
    lr = int(env[b"OMPI_COMM_WORLD_RANK"]), int(env.get(b"OMPI_COMM_WORLD_SIZE", b"0"))
    return (*lr, int(env.get(b"SINEW_RESTART_GENERATION", b"0"))) if generation else lr


def exe_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))
    except OSError:
        return ""


class Follower:
    """Reads a growing file incrementally."""

    def __init__(self, path):
        self.path, self.offset, self.buf = path, 0, ""

    def new_lines(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path, errors="replace") as f:
            f.seek(self.offset)
            chunk = f.read()
            self.offset = f.tell()
        self.buf += chunk
        *lines, self.buf = self.buf.split("\n")
        return lines


INJECTED = re.compile(r"injected fault: killing launch rank (\d+) at phase (\S+) of step (\d+) \(unix_time ([0-9.]+)\)")


def gone(pid):
    """Whether a process has died (exited, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


class Watcher:
    """Follows a running job: its metrics (the highest step), the launch ranks' pids, when each planned kill
    happened (injected ones from their output line or from the pid's death), and does the external kills
    when they are due."""

    def __init__(self, plan, d):
        self.plan, self.d = plan, d
        self.metrics, self.output = Follower(f"{d}/metrics.jsonl"), Follower(f"{d}/out.txt")
        self.launches = Follower(f"{d}/sup.jsonl")
        self.step, self.pids, self.last_scan = 0, {}, 0.0
        self.relaunch_t, self.spawned, self.launcher = None, {}, None  # first relaunch's start; spawned: first seen
        self.fired = [None] * len(plan.kills)  # unix time of each kill, -1 if its target was already gone
        self.notes = []

    def read(self):
        for line in self.metrics.new_lines():
            if '"loss"' in line and '"step"' in line:
                self.step = max(self.step, json.loads(line).get("step", 0))
        for line in self.launches.new_lines():
            e = json.loads(line)
            if e["event"] == "launch" and e["generation"] == 1:
                self.relaunch_t = e["unix_time"]
        for line in self.output.new_lines():
            m = INJECTED.search(line)
            if m:
                for i, k in enumerate(self.plan.kills):
                    if k.how == "inject" and k.rank == int(m.group(1)):
                        self.fired[i] = float(m.group(4))  # the exact time, even if seen dead earlier

    def find_pids(self):
        """The launch ranks' pids (members and hot spares), once training started and before any kill
        (rate-limited: /proc scans)."""
        if (len(self.pids) == self.plan.procs() or self.step == 0 or any(self.fired)
                or time.time() - self.last_scan < 0.05):
            return
        self.last_scan = time.time()
        for p in procs_of(self.d):
            lr = launch_rank(p)
            if lr and lr[1] == self.plan.procs():  # spawned replacements have a world of their own
                self.pids[lr[0]] = p
            elif self.launcher is None and exe_of(p) in ("prterun", "mpirun"):
                self.launcher = p

    def scan_new(self, want):
        """Processes of the job that `want(pid, launch rank, world size, generation)` accepts (a /proc scan)."""
        out = []
        for p in procs_of(self.d):
            if exe_of(p) != "sinew-train":
                continue
            lr = launch_rank(p, generation=True)
            if lr and want(p, *lr):
                out.append(p)
        return out

    def other_kill(self, i, k, now):
        """The kills whose target is not a launch rank of the first launch; returns how long to sleep."""
        if k.how == "node":
            if k.after >= 0:  # during the recovery from kill `after`
                if self.fired[k.after] is None or now < self.fired[k.after] + k.delay_s:
                    return 0.002
            if k.after >= 0 or self.step >= k.step:
                lose = subprocess.run([f"{NET}/testbed.sh", "lose", str(k.rank)], capture_output=True, text=True,
                                      timeout=60)
                if lose.returncode != 0:
                    self.notes.append(f"kill #{i + 1}: the host loss failed: {lose.stderr.strip()}")
                self.fired[i] = time.time()
            return 0.02
        if k.how == "launcher":
            if self.step >= k.step and self.launcher is not None:
                os.kill(self.launcher, signal.SIGKILL)
                self.fired[i] = time.time()
            return 0.02
        if k.how == "relaunch":
            if self.relaunch_t is None or now < self.relaunch_t + k.delay_s:
                return 0.02 if self.relaunch_t is None else max(0.002, self.relaunch_t + k.delay_s - now)
            targets = self.scan_new(lambda p, r, size, gen: gen == 1 and r == k.rank % max(size, 1))
            if targets:
                os.kill(targets[0], signal.SIGKILL)
                self.fired[i] = time.time()
            elif time.time() - self.relaunch_t > 30:
                self.notes.append(f"kill #{i + 1}: no launch rank {k.rank} in the relaunch within 30 s")
                self.fired[i] = -1.0
            return 0.005
        # replacement: the first process spawned after kill `after` (a world of its own: size != procs)
        if self.fired[k.after] is None:
            return 0.01
        if time.time() - self.last_scan >= 0.01:
            self.last_scan = time.time()
            for p in self.scan_new(lambda p, r, size, gen: gen == 0 and size != self.plan.procs()):
                self.spawned.setdefault(p, time.time())
        if not self.spawned:
            if now - self.fired[k.after] > 60:
                self.notes.append(f"kill #{i + 1}: no replacement was spawned within 60 s")
                self.fired[i] = -1.0
            return 0.01
        p, seen = min(self.spawned.items(), key=lambda kv: kv[1])
        if now < seen + k.delay_s:
            return max(0.002, seen + k.delay_s - now)
        if gone(p):
            self.notes.append(f"kill #{i + 1}: the replacement had already exited")
            self.fired[i] = -1.0
        else:
            os.kill(p, signal.SIGKILL)
            self.fired[i] = time.time()
        return 0.02

    def poll(self):
        """One round; returns how long to sleep before the next."""
        self.read()
        self.find_pids()
        now = time.time()
        wait = 0.02
        for i, k in enumerate(self.plan.kills):
            if self.fired[i] is not None:
                continue
            if k.how in ("node", "launcher", "replacement", "relaunch"):
                wait = min(wait, self.other_kill(i, k, now))
                continue
            if k.rank not in self.pids:
                continue
            if k.how == "inject":
                if gone(self.pids[k.rank]):
                    self.fired[i] = now
                continue
            if k.how == "link":
                if self.step >= k.step:
                    cut = subprocess.run([f"{NET}/testbed.sh", "cut", str(k.rank + 1)], capture_output=True,
                                         text=True, timeout=60)
                    if cut.returncode != 0:
                        self.notes.append(f"kill #{i + 1}: the cut failed: {cut.stderr.strip()}")
                    self.fired[i] = time.time()
                continue
            if k.after >= 0:
                if self.fired[k.after] is None:
                    wait = 0.002  # the trigger may come any moment: stay close to it
                    continue
                # After a cut, from the exclusion on: the cut-off process fences itself STALL_S later.
                due = self.fired[k.after] + k.delay_s + (STALL_S if self.plan.kills[k.after].how == "link" else 0)
            else:
                due = now if self.step >= k.step else None
            if due is None:
                continue
            if now < due:
                wait = min(wait, due - now)
                continue
            if gone(self.pids[k.rank]):
                self.notes.append(f"kill #{i + 1}: launch rank {k.rank} had already exited")
                self.fired[i] = -1.0
                continue
            os.kill(self.pids[k.rank], signal.SIGKILL)
            self.fired[i] = time.time()
        return wait


def snapshot(d, keep_dir, procs):
    """For a hung job: which of its processes are left (launch rank, or spawned), and their threads' stacks
    (gdb, if installed) in keep_dir/stacks.txt. Returns a one-line note."""
    os.makedirs(keep_dir, exist_ok=True)
    who = []
    with open(f"{keep_dir}/stacks.txt", "w") as out:
        for p in sorted(procs_of(d)):
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    exe = os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))
            except OSError:
                continue
            lr = launch_rank(p) if exe == "sinew-train" else None
            name = f"{exe} pid {p}"
            if lr:
                name += f" launch rank {lr[0]}" if lr[1] == procs else f" spawned (rank {lr[0]} of {lr[1]})"
            who.append(name)
            out.write(f"==== {name}\n")
            out.flush()
            if exe == "sinew-train" and shutil.which("gdb"):
                try:
                    subprocess.run(["gdb", "-p", str(p), "-batch", "-nx", "-ex", "thread apply all bt"],
                                   stdout=out, stderr=subprocess.STDOUT, timeout=30)
                except subprocess.TimeoutExpired:
                    out.write("(gdb timed out)\n")
    return f"at the deadline: {'; '.join(who) or 'no process left'} (stacks in {keep_dir}/stacks.txt)"


def run_job(plan, train, mpirun, flags, deadline_s, keep_dir):
    """Runs one job with its external kills; returns what happened. The job's directory is removed, its
    output and metrics are copied to keep_dir."""
    d = tempfile.mkdtemp(prefix=f"sinew-chaos-{plan.index}-")
    try:
        # Every job runs under the supervisor (sinew-run): in place when it can, relaunched when it cannot.
        cmd = [f"{ROOT}/mpi_scripts/sinew-supervise", "--events", f"{d}/sup.jsonl", "-n", str(plan.procs())]
        if plan.on_bed():  # mpirun.sh adds the ULFM flags itself; the hostfile: the bed's hosts
            subprocess.run([f"{NET}/testbed.sh", "heal"], capture_output=True, timeout=60, check=True)
            hosts, slots = plan.bed_hosts()
            with open(f"{d}/hosts", "w") as f:
                f.writelines(f"sinew-h{h} slots={slots}\n" for h in range(1, hosts + 1))
            cmd += ["--mpirun", f"{NET}/mpirun.sh --as-mpirun", "--hostfile", f"{d}/hosts"]
        cmd += ["--", train, *plan.options(d)]
        with open(f"{d}/out.txt", "w") as out:
            t0 = time.time()
            job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            w = Watcher(plan, d)
            rc = None
            while rc is None and time.time() - t0 < deadline_s:
                time.sleep(w.poll())
                rc = job.poll()
            wall = time.time() - t0
            hung = rc is None
            if hung:
                w.notes.append(snapshot(d, keep_dir, plan.procs()))
                os.killpg(job.pid, signal.SIGKILL)
                rc = job.wait(timeout=30)
        w.read()  # kills reported after the last poll
        left = procs_of(d)
        for p in left:
            kill9(p)
        if left:
            w.notes.append(f"{len(left)} process(es) of the job still running after mpirun ended: killed")
        audit = None
        if glob.glob(f"{d}/audit/audit-*.txt"):
            a = subprocess.run([sys.executable, f"{ROOT}/mpi_scripts/check-audit.py", f"{d}/audit",
                                "--dataset-size", str(LIMIT_TRAIN), "--epochs", str(EPOCHS)],
                               capture_output=True, text=True, timeout=120)
            audit = {"ok": a.returncode == 0, "output": (a.stdout + a.stderr).strip().splitlines()[-5:]}
        os.makedirs(keep_dir, exist_ok=True)
        for name in ("out.txt", "metrics.jsonl"):
            if os.path.exists(f"{d}/{name}"):
                shutil.copy(f"{d}/{name}", f"{keep_dir}/{name}")
        with open(f"{d}/out.txt", errors="replace") as f:
            text = f.read()
        events = []
        if os.path.exists(f"{d}/metrics.jsonl"):
            with open(f"{d}/metrics.jsonl") as f:
                events = [json.loads(l) for l in f if l.strip() and '"event"' in l]
        # When each kill happened, in seconds after the first one (None: it did not happen).
        first = min((f for f in w.fired if f and f > 0), default=None)
        times = [round(f - first, 3) if f and f > 0 else None for f in w.fired]
        launches = []
        if os.path.exists(f"{d}/sup.jsonl"):
            with open(f"{d}/sup.jsonl") as f:
                launches = [json.loads(l) for l in f if l.strip()]
            shutil.copy(f"{d}/sup.jsonl", f"{keep_dir}/sup.jsonl")
        # A fallback's cost: from the first kill to training back at the step where it failed, i.e. the end
        # of the first step that the last launch completed beyond the newest step the failed launch made.
        # The last launch's records are those after its `start` event (in the file's order: a process of an
        # earlier launch that outlived its mpirun by a moment may still have logged a step after the relaunch
        # began).
        back_s = None
        starts = [e["unix_time"] for e in launches if e["event"] == "launch"]
        if len(starts) > 1 and first:
            with open(f"{d}/metrics.jsonl") as f:
                recs = [json.loads(l) for l in f if l.strip()]
            last = max((i for i, e in enumerate(recs) if e.get("event") == "start"), default=0)
            before = max((e["step"] for e in recs[:last] if "loss" in e and "event" not in e), default=0)
            after = [e["unix_time"] for e in recs[last:] if "loss" in e and "event" not in e and e["step"] > before]
            if after:
                back_s = round(min(after) - first, 2)
        return {"rc": rc, "hung": hung, "wall_s": round(wall, 1), "fired": [t is not None for t in times],
                "kill_times_s": times, "notes": w.notes, "audit": audit, "events": events, "text": text,
                "launches": len(starts), "back_s": back_s}
    finally:
        for p in procs_of(d):  # an exception above must not leave processes behind
            kill9(p)
        shutil.rmtree(d)
        if plan.on_bed():
            subprocess.run([f"{NET}/testbed.sh", "heal"], capture_output=True, timeout=60)


# ---- judging --------------------------------------------------------------------------------------------

# (class, regular expression over the output whose lines are the evidence)
ERROR_EXIT = re.compile(r"sinew: error:")  # a rank that gave up (any other error)
REVOKED_EXIT = re.compile(r"(sinew: error:|\[error\]|\[critical\]).*MPI_ERR_REVOKED")
WATCHDOG = re.compile(r"did not complete within \d+ ms; aborting the job")


def evidence(text, pattern, skip=None, limit=4):
    lines = ["".join(c if c.isprintable() else "?" for c in l[:300])  # output can hold stray bytes
             for l in text.splitlines() if pattern.search(l) and not (skip and skip.search(l))]
    return lines[:limit]


def remarks(r):
    """What went wrong inside a job that still ended right (classes with evidence lines): a process that
    exited on an error (the replacement that was joining when a member died), the spawn watchdog's abort (a
    relaunch by the supervisor followed), the launcher's non-zero exit after the job completed."""
    text = r["text"]
    out = []
    if WATCHDOG.search(text):
        out.append(("watchdog-abort", evidence(text, WATCHDOG)))
    revoked = evidence(text, REVOKED_EXIT)
    if revoked:
        out.append(("revoked-exit", revoked))
    errors = evidence(text, ERROR_EXIT, skip=REVOKED_EXIT)
    if errors:
        out.append(("error-exit", errors))
    late = evidence(text, re.compile(r"sinew-supervise\] (the job completed; the launcher's exit code|the job "
                                     r"completed, but the launcher has not returned)"))
    if late:
        out.append(("launcher-exit-after-done", late))
    return out


def judge(r, reference, tolerance, plan=None):
    """Classes of failure of a run (empty: passed), each with evidence lines. The job runs under the
    supervisor: its exit status is the job's."""
    done = [e for e in r["events"] if e.get("event") == "done"]
    text = r["text"]
    problems = []
    last_words = re.compile(r"\[critical\]|sinew: error:|PRTE ERROR|MPI_ABORT was invoked")
    if r["hung"]:
        problems.append(("hang-after-done" if done else "hang-before-done",
                         [f"the job still running at the deadline ({r['wall_s']} s); killed"]
                         + (evidence(text, last_words) or text.splitlines()[-3:])))
    elif r["rc"] != 0:
        problems.append(("exit-after-done" if done else "exit-before-done",
                         [f"exit {r['rc']}" + (" after the done event" if done else ", no done event")]
                         + evidence(text, last_words)))
    # A process that exits on an error, the spawn watchdog's abort: remarks (remarks()) when the job still
    # ends right; the evidence of a job that did not.
    if not done:
        problems += remarks(r)
    if not r["hung"] and r["rc"] == 0 and not done:
        problems.append(("no-done", ["exit 0 without a done event"]))
    if done and reference is not None:
        acc = done[-1]["test_accuracy"]
        if 100 * (reference - acc) > tolerance:
            problems.append(("accuracy", [f"test accuracy {100 * acc:.2f}% vs reference {100 * reference:.2f}% "
                                          f"(tolerance {tolerance} points)"]))
    # The audit of a run that did not finish fails by construction (the rest of the data was never used):
    # it is checked only when the run says it finished.
    if done and r["audit"] is None:
        problems.append(("audit", ["no audit records"]))
    elif done and not r["audit"]["ok"]:
        problems.append(("audit", r["audit"]["output"]))
    # With a hot spare left (none killed while idle), the first failure must be replaced by it: promoted
    # >= 1 in its failure event (a spawn instead would pass every other check).
    failures = [e for e in r["events"] if e.get("event") == "failure"]
    # (Not when the plan kills that spare as it joins: killed before its promotion, it cannot be used.)
    if (plan is not None and plan.spares_left() > 0 and failures and failures[0].get("promoted", 0) == 0
            and r.get("launches", 1) == 1 and not any(k.relation == "replacement-join" for k in plan.kills)):
        f = failures[0]
        problems.append(("spare-unused", [f"{plan.spares_left()} hot spare(s) left, but the failure at step "
                                          f"{f.get('step', 0) + 1} promoted none (lost {f.get('lost')}, "
                                          f"spawn_ms {f.get('spawn_ms')}, world {f.get('world_size')})"]))
    return problems


def plan_of(d):
    """A Plan from its dictionary in a results file (older files have no spares)."""
    return Plan(**{**d, "kills": [Kill(**k) for k in d["kills"]]})


def reference_accuracy(plan, train, mpirun, flags, out_dir, deadline_s, digest):
    """The failure-free run's test accuracy for this configuration, cached in out_dir for this sinew-train
    binary (`digest`; another build runs it again), None if it failed. Run without spares, checkpoints and
    growth: none of them changes the training (Plan.reference_key)."""
    path = f"{out_dir}/reference-{plan.reference_key()}.json"
    if os.path.exists(path):
        with open(path) as f:
            cached = json.load(f)
        if cached.get("sinew_train_sha256") == digest:
            return cached["test_accuracy"]
    ref = Plan(-1, plan.n, plan.algorithm, False, False, [], spares=0)
    print(f"reference {plan.reference_key()}: running the failure-free job", flush=True)
    r = run_job(ref, train, mpirun, flags, deadline_s, f"{out_dir}/logs/reference-{plan.reference_key()}")
    done = [e for e in r["events"] if e.get("event") == "done"]
    if r["hung"] or r["rc"] != 0 or not done:
        print(f"reference {plan.reference_key()}: FAILED (exit {r['rc']}, hung {r['hung']})", flush=True)
        return None
    acc = done[-1]["test_accuracy"]
    with open(path, "w") as f:
        json.dump({"test_accuracy": acc, "wall_s": r["wall_s"], "sinew_train_sha256": digest}, f)
    print(f"reference {plan.reference_key()}: {100 * acc:.2f}% in {r['wall_s']} s", flush=True)
    return acc


# ---- report ---------------------------------------------------------------------------------------------


def summary(results):
    lines = ["", f"{'pattern':<16} {'available':<9} {'trials':>6} {'pass':>5} {'fail':>5}  what"]
    for p in PATTERNS:
        mine = [r for r in results if p.name in r["patterns"]]
        ok = sum(1 for r in mine if r["passed"])
        avail = "yes" if p.available else "no"
        lines.append(f"{p.name:<16} {avail:<9} {len(mine):>6} {ok:>5} {len(mine) - ok:>5}  {p.summary}")
    ok = sum(1 for r in results if r["passed"])
    lines.append(f"{'all':<16} {'':<9} {len(results):>6} {ok:>5} {len(results) - ok:>5}")
    outcomes = {o: sum(1 for r in results if r.get("outcome") == o) for o in ("in place", "fallback", "wrong")}
    lines += ["", "outcomes: " + ", ".join(f"{o} {k}" for o, k in outcomes.items())]
    backs = sorted(r["back_s"] for r in results if r.get("outcome") == "fallback" and r.get("back_s") is not None)
    if backs:
        lines.append(f"fallback, kill -> back at the failed step: median {statistics.median(backs):.1f} s, "
                     f"min {backs[0]:.1f} s, max {backs[-1]:.1f} s ({len(backs)} trials)")
    rem = {}
    for r in results:
        for c in r.get("remarks", {}):
            rem.setdefault(c, []).append(r["trial"])
    if rem:
        lines.append("remarks (inside jobs that ended right): "
                     + "; ".join(f"{c} {len(ts)} ({' '.join(map(str, ts[:12]))})" for c, ts in sorted(rem.items())))
    classes = {}
    for r in results:
        for c in r["classes"]:
            classes.setdefault(c, []).append(r["trial"])
    if classes:
        lines += ["", f"{'failure class':<18} {'trials':>6}  which"]
        for c, ts in sorted(classes.items(), key=lambda kv: -len(kv[1])):
            lines.append(f"{c:<18} {len(ts):>6}  {' '.join(map(str, ts))}")
    return "\n".join(lines)


def rejudge(path, tolerance):
    """Judges the failed trials of a results file again from their kept logs (after a change of the
    classification), and prints the summary."""
    with open(path) as f:
        results = json.load(f)["trials"]
    for res in results:
        logs = res.get("logs") or os.path.join(os.path.dirname(path), f"logs/seed{res['seed']}-trial{res['trial']}")
        if res["passed"] or not os.path.exists(f"{logs}/out.txt"):
            continue
        with open(f"{logs}/out.txt", errors="replace") as f:
            text = f.read()
        events = []
        if os.path.exists(f"{logs}/metrics.jsonl"):
            with open(f"{logs}/metrics.jsonl") as f:
                events = [json.loads(l) for l in f if l.strip() and '"event"' in l]
        audit = res.get("audit") or {"ok": "audit" not in res["classes"], "output": res["evidence"].get("audit", [])}
        r = {"rc": res["rc"], "hung": res["hung"], "wall_s": res["wall_s"], "audit": audit, "events": events,
             "text": text}
        problems = judge(r, res["reference_accuracy"], tolerance, plan_of(res["plan"]))
        res.update(passed=not problems, classes=[c for c, _ in problems], evidence={c: ev for c, ev in problems})
        print(f"trial {res['trial']:3d}: {'PASS' if not problems else 'FAIL ' + ','.join(res['classes'])}")
    print(summary(results))
    return 0 if all(r["passed"] for r in results) else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", help="run only these trials (comma-separated numbers), to replay them")
    ap.add_argument("--out", default=os.path.join(ROOT, "build/chaos"),
                    help="references, logs of failed trials, results (default build/chaos)")
    ap.add_argument("--json", help="results file (default OUT/results-SEED.json)")
    ap.add_argument("--deadline", type=float, default=120, help="seconds before a job counts as hung")
    ap.add_argument("--tolerance", type=float, default=1.0, help="accuracy points allowed below the reference")
    default_train = os.path.join(ROOT, "build/apps/sinew-train")
    ap.add_argument("--train", default=default_train, help="the sinew-train to run (default build/apps/sinew-train)")
    ap.add_argument("--patterns", help="keep only trials whose plan has one of these patterns (comma-separated)")
    ap.add_argument("--algorithms", help="draw the algorithm from these only (comma-separated; fewer "
                    f"configurations, fewer reference runs); default all: {','.join(sorted(ALGORITHMS))}; also "
                    f"{','.join(sorted(SHARDED))} (the optimiser state sharded, drawn only when named)")
    ap.add_argument("--spares", default="0,1,2", help="the numbers of hot spares a trial with growth draws from "
                    "(comma-separated, default 0,1,2; 0: no spares, the plans of the driver before them)")
    ap.add_argument("--link-cuts", type=float, default=0.1, help="the chance that a trial's first member kill is "
                    "a cut of its data link on the test bed instead (hpc/net/; needs root; default 0.1, 0: none)")
    ap.add_argument("--node-loss", type=float, default=0.15, help="the chance that a trial loses a host of the bed "
                    f"instead ({NODE_HOSTS} hosts x {SLOTS} ranks; needs root; default 0.15, 0: none)")
    ap.add_argument("--recovery-node-loss", type=float, default=0.0, help="the chance that a node-loss trial "
                    "first kills a rank on another host and loses the node 10-40 ms later, during the recovery "
                    "(a stream of its own; default 0)")
    ap.add_argument("--launcher-kills", type=float, default=0.05, help="the chance that a trial kills mpirun instead "
                    "(default 0.05, 0: none)")
    ap.add_argument("--join-kills", type=float, default=0.5, help="the chance that a trial with a replacement kills "
                    "it while it joins, or kills the spawning root during the spawn (default 0.5, 0: none)")
    ap.add_argument("--dry-run", action="store_true", help="print the plans, run nothing")
    ap.add_argument("--rejudge", metavar="RESULTS", help="classify a results file's failed trials again from "
                    "their logs and print the summary; runs nothing")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that run_job's clean-up runs
    if a.rejudge:
        return rejudge(a.rejudge, a.tolerance)

    algorithms = sorted(set(a.algorithms.split(","))) if a.algorithms else None
    if algorithms and set(algorithms) - set(ALGORITHMS_ALL):
        ap.error(f"unknown algorithms {sorted(set(algorithms) - set(ALGORITHMS_ALL))}; known: "
                 f"{sorted(ALGORITHMS_ALL)}")
    try:
        spares = sorted({int(k) for k in a.spares.split(",")})
    except ValueError:
        ap.error(f"--spares {a.spares}: expected comma-separated numbers of spares")
    if spares[0] < 0:
        ap.error(f"--spares {a.spares}: a number of spares is at least 0")
    # What the plans depend on besides seed and trial, for the replay command.
    if not 0 <= a.link_cuts <= 1:
        ap.error(f"--link-cuts {a.link_cuts}: a chance, between 0 and 1")
    for name in ("node_loss", "launcher_kills", "join_kills", "recovery_node_loss"):
        if not 0 <= getattr(a, name) <= 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(a, name)}: a chance, between 0 and 1")
    if a.node_loss + a.launcher_kills > 1:
        ap.error("--node-loss and --launcher-kills together: at most 1")
    plan_options = (f" --algorithms {','.join(algorithms)}" if algorithms else "") + \
        (f" --spares {','.join(map(str, spares))}" if spares != [0, 1, 2] else "") + \
        (f" --link-cuts {a.link_cuts}" if a.link_cuts != 0.1 else "") + \
        (f" --node-loss {a.node_loss}" if a.node_loss != 0.15 else "") + \
        (f" --launcher-kills {a.launcher_kills}" if a.launcher_kills != 0.05 else "") + \
        (f" --join-kills {a.join_kills}" if a.join_kills != 0.5 else "") + \
        (f" --recovery-node-loss {a.recovery_node_loss}" if a.recovery_node_loss else "")
    indices = [int(k) for k in a.only.split(",")] if a.only else list(range(1, a.trials + 1))
    plans = [make_plan(a.seed, k, algorithms, spares, a.link_cuts, a.node_loss, a.launcher_kills, a.join_kills,
                       a.recovery_node_loss) for k in indices]
    if a.patterns:
        want = set(a.patterns.split(","))
        unknown = want - {p.name for p in PATTERNS}
        if unknown:
            ap.error(f"unknown patterns {sorted(unknown)}; known: {[p.name for p in PATTERNS]}")
        plans = [pl for pl in plans if want & {p.name for p in PATTERNS if p.in_plan(pl)}]
    if a.dry_run:
        for pl in plans:
            names = [p.name for p in PATTERNS if p.in_plan(pl)]
            print(f"trial {pl.index:3d}: {pl.describe()} patterns={','.join(names)}")
        counts = [(p.name, sum(1 for pl in plans if p.in_plan(pl))) for p in PATTERNS]
        print("patterns: " + ", ".join(f"{name} {k}" for name, k in counts if k))
        return 0

    mpirun, flags, ulfm = mpi_env()
    if not ulfm:
        print("SKIP chaos: needs the Open MPI with ULFM (mpi_scripts/setup.sh builds it)")
        return 77
    if not os.path.exists(f"{FASHION_MNIST}/train-images-idx3-ubyte.gz"):
        print(f"SKIP chaos: {FASHION_MNIST} is not installed (mpi_scripts/setup.sh installs it)")
        return 77
    bed = max((pl.bed_hosts()[0] for pl in plans if pl.on_bed()), default=0)
    if bed:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
            print("SKIP chaos: link cuts and node losses need the test bed (root, ip, tc); run with --link-cuts 0 "
                  "--node-loss 0 without them")
            return 77
        up = subprocess.run([f"{NET}/testbed.sh", "up", str(bed), "unlimited"], capture_output=True, text=True,
                            timeout=120)
        if up.returncode != 0:
            subprocess.run([f"{NET}/testbed.sh", "down"], capture_output=True, timeout=120)
            print(f"SKIP chaos: the test bed could not be built ({up.stderr.strip()}); run with --link-cuts 0")
            return 77
        atexit.register(lambda: subprocess.run([f"{NET}/testbed.sh", "down"], capture_output=True, timeout=120))
    os.makedirs(a.out, exist_ok=True)
    # A private copy of the binary, so that a rebuild during the campaign does not change what runs (the
    # spawn starts /proc/self/exe: the copy).
    train = f"{a.out}/sinew-train"
    shutil.copy(a.train, train)
    with open(train, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    print(f"chaos: seed {a.seed}, {len(plans)} trials, sinew-train sha256 {digest[:12]}, deadline {a.deadline} s",
          flush=True)

    results = []
    for pl in plans:
        names = [p.name for p in PATTERNS if p.in_plan(pl)]
        print(f"trial {pl.index:3d}: {pl.describe()} patterns={','.join(names)}", flush=True)
        ref = reference_accuracy(pl, train, mpirun, flags, a.out, a.deadline, digest)
        logs = f"{a.out}/logs/seed{a.seed}-trial{pl.index}"
        for again in range(2, 1000):  # a replay keeps the logs of an earlier failure of the same trial
            if not os.path.exists(logs):
                break
            logs = f"{a.out}/logs/seed{a.seed}-trial{pl.index}.{again}"
        r = run_job(pl, train, mpirun, flags, a.deadline, logs)
        problems = judge(r, ref, a.tolerance, pl)
        if ref is None:
            problems.append(("reference-failed", [f"the failure-free {pl.reference_key()} run failed"]))
        done = [e for e in r["events"] if e.get("event") == "done"]
        acc = done[-1]["test_accuracy"] if done else None
        outcome = "wrong" if problems else ("in place" if r["launches"] <= 1 else "fallback")
        notes = remarks(r) if not problems else []
        res = {"trial": pl.index, "outcome": outcome, "launches": r["launches"], "back_s": r["back_s"],
               "remarks": {c: ev for c, ev in notes}, "seed": a.seed, "plan": dataclasses.asdict(pl), "describe": pl.describe(),
               "patterns": names, "passed": not problems, "classes": [c for c, _ in problems],
               "evidence": {c: ev for c, ev in problems}, "rc": r["rc"], "hung": r["hung"], "wall_s": r["wall_s"],
               "fired": r["fired"], "kill_times_s": r["kill_times_s"], "notes": r["notes"], "audit": r["audit"],
               "test_accuracy": acc, "reference_accuracy": ref,
               "failures": sum(1 for e in r["events"] if e.get("event") == "failure"),
               "promoted": sum(e.get("promoted", 0) for e in r["events"] if e.get("event") in ("failure", "grow")),
               "spawn_ms": round(sum(e.get("spawn_ms", 0) for e in r["events"] if e.get("event") == "failure"), 1),
               "world_size": done[-1]["world_size"] if done else None, "logs": None if not problems else logs,
               "replay": f"/usr/bin/python3 hpc/chaos/chaos.py --seed {a.seed} --only {pl.index}{plan_options}"
                         + (f" --train {a.train}" if a.train != default_train else "")}
        results.append(res)
        if not problems:
            shutil.rmtree(logs)
        fired = f"{sum(r['fired'])}/{len(pl.kills)} kills at {r['kill_times_s']} s"
        accs = f"acc {100 * acc:.2f}%" if acc is not None else "no done"
        verdict = f"PASS {outcome}" if not problems else "FAIL " + ",".join(res["classes"])
        if outcome == "fallback":
            verdict += f" ({r['launches']} launches, back at the failed step {r['back_s']} s after the kill)"
        print(f"trial {pl.index:3d}: {verdict} (exit {r['rc']}, {r['wall_s']} s, {fired}, {accs}, "
              f"{res['failures']} failure events" + (f", {res['promoted']} spares promoted" if pl.spares else "")
              + ")", flush=True)
        for c, ev in problems:
            for line in ev:
                print(f"    {c}: {line}", flush=True)
        for note in r["notes"]:
            print(f"    note: {note}", flush=True)
        for c, ev in notes:
            print(f"    remark {c}: {ev[0] if ev else ''}", flush=True)
        if problems:
            print(f"    replay: {res['replay']}   logs: {logs}", flush=True)

    print(summary(results))
    path = a.json or f"{a.out}/results-{a.seed}.json"
    with open(path, "w") as f:
        json.dump({"seed": a.seed, "sinew_train_sha256": digest, "deadline_s": a.deadline,
                   "tolerance": a.tolerance, "patterns": [{"name": p.name, "available": p.available,
                                                           "summary": p.summary} for p in PATTERNS],
                   "trials": results}, f, indent=1)
    print(f"results: {path}")
    return 0 if all(r["passed"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
