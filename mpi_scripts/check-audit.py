#!/usr/bin/env python3
"""Checks Sinew's exactly-once audit: every training sample used exactly once per epoch.

sinew-train --audit-dir DIR makes every rank append one line per micro-batch it trains on:

    GENERATION MEMBERSHIP_EPOCH STEP DATA_EPOCH index index ...

GENERATION counts relaunches (restart mode), MEMBERSHIP_EPOCH counts changes of the group (in-place
recovery, growth, leave). An attempt (GENERATION, MEMBERSHIP_EPOCH) starts at the first step it records;
when a later attempt starts at step s, the group rolled back to s - 1, so an earlier attempt's records of
steps >= s were never committed. The remaining records must cover each epoch's samples exactly once.

Exit status: 0 the audit holds, 1 it does not (the problems are printed), 2 bad usage or no records.
"""
import argparse
import collections
import glob
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the --audit-dir of the run")
    ap.add_argument("--dataset-size", type=int, required=True, help="training samples (after --limit-train)")
    ap.add_argument("--epochs", type=int, required=True, help="epochs the run was asked to train")
    ap.add_argument("--partial-last", action="store_true",
                    help="the last epoch may be incomplete (--max-steps); still never a sample twice")
    args = ap.parse_args()

    files = sorted(glob.glob(os.path.join(args.dir, "audit-*.txt")))
    if not files:
        print(f"check-audit: no audit-*.txt files in {args.dir}", file=sys.stderr)
        return 2
    records = []  # (attempt, step, epoch, indices)
    for path in files:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                parts = line.split()
                if not line.endswith("\n") or len(parts) < 4:
                    # A rank killed in the middle of a write leaves a torn last line: not committed.
                    continue
                gen, mep, step, epoch = (int(p) for p in parts[:4])
                records.append(((gen, mep), step, epoch, [int(p) for p in parts[4:]]))

    first_step = {}
    for attempt, step, _, _ in records:
        first_step[attempt] = min(step, first_step.get(attempt, step))
    attempts = sorted(first_step)

    def committed(attempt, step):
        return not any(b > attempt and first_step[b] <= step for b in attempts)

    used = collections.defaultdict(collections.Counter)  # epoch -> index -> count
    kept = dropped = 0
    for attempt, step, epoch, idx in records:
        if committed(attempt, step):
            used[epoch].update(idx)
            kept += 1
        else:
            dropped += 1

    problems = []
    for epoch in range(args.epochs):
        counts = used.get(epoch, collections.Counter())
        twice = [i for i, c in counts.items() if c > 1]
        missing = args.dataset_size - len(counts)
        out_of_range = [i for i in counts if not 0 <= i < args.dataset_size]
        if twice:
            problems.append(f"epoch {epoch}: {len(twice)} samples used more than once (e.g. {sorted(twice)[:5]})")
        if out_of_range:
            problems.append(f"epoch {epoch}: indices outside the data set (e.g. {out_of_range[:5]})")
        last = epoch == args.epochs - 1
        if missing and not (last and args.partial_last):
            problems.append(f"epoch {epoch}: {missing} of {args.dataset_size} samples never used")
    extra = sorted(e for e in used if e >= args.epochs)
    if extra:
        problems.append(f"records of epochs beyond --epochs: {extra}")

    print(f"check-audit: {len(files)} rank files, {len(attempts)} attempts, {kept} committed micro-batches, "
          f"{dropped} rolled back")
    for epoch in sorted(used):
        print(f"  epoch {epoch}: {sum(used[epoch].values())} samples used, {len(used[epoch])} distinct")
    if problems:
        for p in problems:
            print(f"check-audit: FAILED: {p}")
        return 1
    print("check-audit: OK, every sample exactly once per epoch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
