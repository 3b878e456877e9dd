#!/usr/bin/env python3
"""Copies a job's output from stdin to stdout, holding back a line once lines like it have flooded the log.

A failure can make a library print one message millions of times (Open MPI 5.0.7's libnbc:
"NBC_Progress: an error 75 was found during schedule 0x... at row-offset 3 - aborting the schedule", 5.7 and
9.4 million lines in two runs). Two lines are alike when they are equal with every number (decimal or hex)
replaced by '#'. The first --keep lines of each kind pass; after that, lines of that kind are counted, not
printed, and every --every seconds (and at the end) one line says how many were held back:

    [sinew] 1204331 more lines like: NBC_Progress: an error # was found during schedule # ...

Lines that contain --always (the supervisor's own protocol: each leaving process's "exiting for a relaunch
from the latest checkpoint") always pass. Exit status 0 (1 if stdout fails).
"""
import argparse
import re
import sys
import time

NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+(\.\d+)?")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=int, default=20, help="lines of one kind that pass (default 20)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between the held-back counts (default 10)")
    ap.add_argument("--always", action="append", default=[], help="lines containing this always pass")
    args = ap.parse_args()
    seen = {}  # kind -> lines so far
    held = {}  # kind -> lines held back since the last count
    last = time.monotonic()
    out = sys.stdout

    def report():
        for kind, n in held.items():
            if n > 0:
                out.write(f"[sinew] {n} more line{'s' if n > 1 else ''} like: {kind}\n")
        held.clear()

    for line in sys.stdin.buffer:
        text = line.decode("utf-8", "replace")
        wrote = True
        if not any(a in text for a in args.always):
            kind = NUMBER.sub("#", text.rstrip("\n"))[:200]
            n = seen.get(kind, 0) + 1
            seen[kind] = n
            if n > args.keep:
                held[kind] = held.get(kind, 0) + 1
                wrote = False
        if wrote:
            out.write(text)
        now = time.monotonic()
        if held and now - last >= args.every:
            report()
            last = now
            wrote = True
        if wrote:
            out.flush()
    report()
    out.flush()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(1)
