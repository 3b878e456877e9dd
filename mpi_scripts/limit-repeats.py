#!/usr/bin/env python3
"""Copies a job's output from stdin to stdout, holding back a line once lines like it have flooded the log.

A failure can make a library print one message millions of times (Open MPI 5.0.7's libnbc:
"NBC_Progress: an error 75 was found during schedule 0x... at row-offset 3 - aborting the schedule", 5.7 and
9.4 million lines in two runs). Two lines are alike when they are equal with every number (decimal or hex)
replaced by '#'. The first --keep lines of each kind pass; after that, lines of that kind are counted, not
printed, and every --every seconds (and at the end) one line says how many were held back:

    [sinew] 1204331 more lines like: NBC_Progress: an error # was found during schedule # ...

Lines that contain an --always text always pass. Exit status 0 (1 if stdout fails). sinew-run filters the
job's output with the same Limiter (it imports this file).
"""
import argparse
import re
import sys
import time

NUMBER = re.compile(rb"0x[0-9a-fA-F]+|\d+(\.\d+)?")


class Limiter:
    """Writes lines (bytes) to `out` (a text stream) the way the program above does; finish() at the end."""

    def __init__(self, out, keep=20, every=10.0, always=()):
        self.out, self.keep, self.every = out, keep, every
        self.always = [a.encode() for a in always]
        self.seen = {}  # kind (bytes) -> lines so far
        self.held = {}  # kind -> lines held back since the last count
        self.last = time.monotonic()

    def report(self):
        for kind, n in self.held.items():
            if n > 0:
                self.out.write(f"[sinew] {n} more line{'s' if n > 1 else ''} like: "
                               f"{kind.decode('utf-8', 'replace')}\n")
        self.held.clear()

    def feed(self, line, flush=True):
        """One line (bytes, or text; with its newline); `flush`: flush the output after a line written.
        Bytes all the way for a line held back: a flood costs one regular expression per line."""
        raw = line if isinstance(line, bytes) else line.encode("utf-8", "replace")
        wrote = True
        if not (self.always and any(a in raw for a in self.always)):
            kind = NUMBER.sub(b"#", raw.rstrip(b"\n"))[:200]
            n = self.seen.get(kind, 0) + 1
            self.seen[kind] = n
            if n > self.keep:
                self.held[kind] = self.held.get(kind, 0) + 1
                wrote = False
        if wrote:
            self.out.write(raw.decode("utf-8", "replace"))
        now = time.monotonic()
        if self.held and now - self.last >= self.every:
            self.report()
            self.last = now
            wrote = True
        if wrote and flush:
            self.out.flush()

    def finish(self):
        self.report()
        self.out.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", type=int, default=20, help="lines of one kind that pass (default 20)")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between the held-back counts (default 10)")
    ap.add_argument("--always", action="append", default=[], help="lines containing this always pass")
    args = ap.parse_args()
    limiter = Limiter(sys.stdout, args.keep, args.every, args.always)
    for line in sys.stdin.buffer:
        limiter.feed(line)
    limiter.finish()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(1)
