#!/usr/bin/env python3
"""A reader of a checkpoint directory that a job is writing, from another client of the file system (the
second GlusterFS mount of hpc/pfs/glusterfs.sh): what an evaluation job or a resuming job does while
training runs. It checks that a checkpoint it once saw committed stays complete: it must verify, and stay.

Two loads run together until the stop file appears (or the deadline passes):
 - lookups: a thread reads DIR and stats DIR/ckpt-<W>/COMMITTED in a loop, W being the step it waits for
   next (the last one it saw committed + --every), as a job waiting for step W does. On GlusterFS such
   reads and lookups while another client renames a directory into that name are what lost files under
   the old rename commit. A checkpoint whose COMMITTED it finds counts as seen committed (under the old
   protocol, recognised by its .partial names: a ckpt-<W> that exists).
 - listings: `sinew-ckpt list DIR --json`; every entry that is not uncommitted (or, before the commit
   record, "partial") counts as seen committed.
Every checkpoint newly seen committed is verified (`sinew-ckpt verify`), retrying for --retry seconds (a
just-committed file may not be visible to this client yet: ENOENT, ESTALE); one that still fails is broken.
A checkpoint seen committed that later disappears from the listing is lost.

Prints one JSON object on stdout with the counts and the names of the broken and lost checkpoints; exit 0
when there are none, 1 when there are, 3 when the deadline passed first (the counts are printed anyway).

usage: pfs_scan.py --dir DIR --ckpt SINEW_CKPT --stop-file FILE [--every N] [--retry S] [--deadline S]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time

NAME = re.compile(r"^ckpt-(\d{10})(?:\.(\d+))?$")
# States of `sinew-ckpt list --json` entries that are not committed checkpoints (no commit record; the old
# protocol's .partial directories). Every other state (valid, invalid) is a committed one.
UNCOMMITTED = ("uncommitted", "partial")


def log(msg):
    print(f"[pfs_scan {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Scanner:
    def __init__(self, args):
        self.a = args
        self.lock = threading.Lock()
        self.seen = {}  # name -> {"step", "by", "t"}: seen committed (by lookup or by list)
        self.new = []  # names seen committed, not yet verified
        self.verified = set()
        self.broken = {}  # name -> why
        self.lost = {}  # name -> why
        self.list_invalid = {}  # name -> reason: listed as committed but invalid at some point
        self.uncommitted_at_end = []
        self.lookups = 0
        self.lookup_hits = 0
        self.listings = 0
        self.list_errors = 0
        self.waiting_for = args.every
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    # --- what the scanner saw ---------------------------------------------------------------------------
    def saw(self, name, step, by):
        with self.lock:
            if name in self.seen:
                return
            self.seen[name] = {"step": step, "by": by, "t": time.monotonic()}
            self.new.append(name)
            if step + self.a.every > self.waiting_for:
                self.waiting_for = step + self.a.every

    # --- lookups ------------------------------------------------------------------------------------------
    def lookup_loop(self):
        d = self.a.dir
        last_readdir = 0.0
        mode = None  # "record" once a COMMITTED was found; "rename" once a .partial name was seen first
        while not self.stop.is_set():
            with self.lock:
                w = self.waiting_for
            self.lookups += 1
            base = f"ckpt-{w:010d}"
            try:
                os.stat(os.path.join(d, base, "COMMITTED"))
                self.lookup_hits += 1
                mode = "record"
                self.saw(base, w, "lookup")
                continue
            except OSError:
                pass
            if mode == "rename" and os.path.isdir(os.path.join(d, base)):
                # The old protocol: the rename of ckpt-<W>.partial to ckpt-<W> was the commit.
                self.lookup_hits += 1
                self.saw(base, w, "lookup")
                continue
            # Read the directory, as a job scanning for new checkpoints does (with the lookups, the load
            # under which the rename commit lost files), and follow the writer: a name of a step past W
            # (a write in progress, or W's commit missed) moves the wait on to that step. A retried
            # attempt of step W commits under ckpt-<W>.<k>.
            now = time.monotonic()
            if now - last_readdir >= self.a.readdir_interval:
                last_readdir = now
                try:
                    names = os.listdir(d)
                except OSError:
                    names = []
                newest = w
                for n in names:
                    if n.endswith(".partial") and mode is None:
                        mode = "rename"
                    m = NAME.match(n.removesuffix(".partial"))
                    if not m:
                        continue
                    s = int(m.group(1))
                    newest = max(newest, s)
                    if s == w and m.group(2) and not n.endswith(".partial"):
                        try:
                            os.stat(os.path.join(d, n, "COMMITTED"))
                            self.lookup_hits += 1
                            self.saw(n, w, "lookup")
                        except OSError:
                            pass
                if newest > w:
                    with self.lock:
                        self.waiting_for = max(self.waiting_for, newest)
            time.sleep(self.a.lookup_interval)

    # --- listings -------------------------------------------------------------------------------------------
    def listing(self):
        try:
            p = subprocess.run([self.a.ckpt, "list", self.a.dir, "--json"], capture_output=True, text=True,
                               timeout=120)
        except subprocess.TimeoutExpired:
            self.list_errors += 1
            log("sinew-ckpt list timed out after 120 s")
            return None
        self.listings += 1
        if p.returncode != 0:
            self.list_errors += 1
            log(f"sinew-ckpt list failed (exit {p.returncode}): {p.stderr.strip()[:300]}")
            return None
        try:
            return json.loads(p.stdout)["checkpoints"]
        except (ValueError, KeyError) as e:
            self.list_errors += 1
            log(f"sinew-ckpt list --json: unreadable output ({e})")
            return None

    def absorb(self, rows):
        listed = set()
        for r in rows:
            if r.get("state") in UNCOMMITTED:
                continue
            name = r["name"]
            listed.add(name)
            self.saw(name, int(r["step"]), "list")
            if r.get("state") != "valid" and name not in self.list_invalid:
                self.list_invalid[name] = r.get("reason", "")
                log(f"listed as committed but {r.get('state')}: {name}: {r.get('reason', '')}")
        return listed

    # --- verification ---------------------------------------------------------------------------------------
    def verify(self, name):
        path = os.path.join(self.a.dir, name)
        t0 = time.monotonic()
        tries = 0
        while True:
            tries += 1
            try:
                p = subprocess.run([self.a.ckpt, "verify", path], capture_output=True, text=True, timeout=60)
                ok, why = p.returncode == 0, (p.stdout + p.stderr).strip()
            except subprocess.TimeoutExpired:
                ok, why = False, "sinew-ckpt verify timed out after 60 s"
            if ok:
                if tries > 1:
                    log(f"{name}: verified on try {tries} ({time.monotonic() - t0:.2f} s)")
                self.verified.add(name)
                return
            if time.monotonic() - t0 >= self.a.retry:
                self.broken[name] = why[-400:]
                log(f"BROKEN {name} (seen committed by {self.seen[name]['by']}, {tries} tries over "
                    f"{self.a.retry:.1f} s): {why[-400:]}")
                return
            time.sleep(0.2)

    def verify_new(self):
        while time.monotonic() - self.t0 <= self.a.deadline:  # the main loop reports the deadline
            with self.lock:
                if not self.new:
                    return
                name = self.new.pop(0)
            self.verify(name)

    def check_lost(self, listed):
        for name in list(self.seen):
            if name in listed or name in self.lost:
                continue
            # Not listed: gone for good if the directory cannot be looked up either (a listing may be racy).
            if not os.path.isdir(os.path.join(self.a.dir, name)):
                self.lost[name] = "seen committed, no longer listed or found"
                log(f"LOST {name}: seen committed by {self.seen[name]['by']}, now gone")

    # --- main loop -----------------------------------------------------------------------------------------
    def run(self):
        t0 = self.t0 = time.monotonic()
        th = threading.Thread(target=self.lookup_loop, daemon=True)
        th.start()
        timed_out = False
        final = False
        while True:
            stopping = os.path.exists(self.a.stop_file)
            rows = self.listing()
            if rows is not None:
                listed = self.absorb(rows)
                self.verify_new()
                self.check_lost(listed)
                if stopping:
                    self.uncommitted_at_end = [r["name"] for r in rows if r.get("state") in UNCOMMITTED]
            else:
                self.verify_new()
            if stopping:
                if final or rows is not None:
                    break
                final = True  # one more try at a final listing
            if time.monotonic() - t0 > self.a.deadline:
                timed_out = True
                log(f"deadline of {self.a.deadline:.0f} s passed")
                break
            time.sleep(self.a.list_interval)
        self.stop.set()
        th.join(timeout=5)
        out = {
            "seen_committed": len(self.seen),
            "seen_by_lookup": sum(1 for v in self.seen.values() if v["by"] == "lookup"),
            "verified": len(self.verified),
            "broken": self.broken,
            "lost": self.lost,
            "listed_invalid": self.list_invalid,
            "uncommitted_at_end": self.uncommitted_at_end,
            "lookups": self.lookups,
            "lookup_hits": self.lookup_hits,
            "listings": self.listings,
            "list_errors": self.list_errors,
            "seconds": round(time.monotonic() - t0, 1),
            "timed_out": timed_out,
        }
        print(json.dumps(out), flush=True)
        if timed_out:
            return 3
        return 1 if self.broken or self.lost else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="the checkpoint directory, through the readers' mount")
    ap.add_argument("--ckpt", required=True, help="the sinew-ckpt binary")
    ap.add_argument("--stop-file", required=True, help="finish (after a last listing) once this file exists")
    ap.add_argument("--every", type=int, default=1, help="steps between checkpoints (--checkpoint-every)")
    ap.add_argument("--retry", type=float, default=2.0, help="seconds a failing verification is retried")
    ap.add_argument("--deadline", type=float, default=600, help="give up after this many seconds")
    ap.add_argument("--lookup-interval", type=float, default=0.002, help="seconds between lookups")
    ap.add_argument("--readdir-interval", type=float, default=0.0,
                    help="least seconds between the lookup thread's directory reads (0: every lookup)")
    ap.add_argument("--list-interval", type=float, default=0.05, help="seconds between listings")
    a = ap.parse_args()
    if a.every < 1:
        ap.error("--every must be >= 1")
    return Scanner(a).run()


if __name__ == "__main__":
    sys.exit(main())
