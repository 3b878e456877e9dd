#!/usr/bin/env python3
"""Checks the metrics (JSON Lines) of an elastic sinew-train run: it finished, saw the expected events,
and reached a test accuracy within a tolerance of a reference run. Prints what it found; exit 1 if not.

usage: check_run.py METRICS [--failures N] [--event NAME[:COUNT]]... [--reference FILE --tolerance PTS]
       [--final-world-size N] [--write-reference FILE]
"""
import argparse
import json
import sys


def expected_value(text):
    """The expected value of --field as JSON (true, 3, 0.5, "x", null), or the plain string if it is not JSON
    (--field shrink.reason=leave)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def field_matches(got, want_text):
    """Whether a metrics value equals the expected one: numbers within 1e-6 (relative above 1), booleans only
    to booleans (True is not 1 here), everything else by JSON equality."""
    want = expected_value(want_text)
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(want, bool) and isinstance(got, bool) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return abs(got - want) <= 1e-6 * max(1.0, abs(want))
    return got == want


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("metrics")
    ap.add_argument("--failures", type=int, help="exactly this many failure events")
    ap.add_argument("--event", action="append", default=[], help="NAME or NAME:MIN_COUNT that must appear")
    ap.add_argument("--reference", help="a file with the failure-free run's test accuracy")
    ap.add_argument("--tolerance", type=float, default=3.0, help="accuracy points allowed below the reference")
    ap.add_argument("--final-world-size", type=int)
    ap.add_argument("--write-reference", help="write this run's test accuracy here")
    ap.add_argument("--field", action="append", default=[],
                    help="EVENT.KEY=VALUE: the last EVENT has KEY equal to VALUE, read as JSON when it parses "
                         "(true, 2, 0.5, null; numbers within 1e-6), else as a string")
    a = ap.parse_args()

    lines = []
    with open(a.metrics) as f:
        for raw in f:
            raw = raw.strip()
            if raw:
                lines.append(json.loads(raw))
    events = [l for l in lines if "event" in l]
    counts = {}
    for e in events:
        counts[e["event"]] = counts.get(e["event"], 0) + 1
    print("events:", ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())))
    problems = []
    done = [e for e in events if e["event"] == "done"]
    if not done:
        problems.append("no 'done' event: the run did not finish")
    else:
        d = done[-1]
        acc = "not evaluated" if d["test_accuracy"] is None else f"{100 * d['test_accuracy']:.2f}%"
        print(f"done: test accuracy {acc}, {d['steps']} steps, world size "
              f"{d['world_size']}, failures seen by rank 0: {d.get('failures')}")
        if d["test_accuracy"] is None and (a.reference or a.write_reference):
            problems.append("the run ended without an evaluation (test_accuracy null): nothing to compare")
        if a.final_world_size is not None and d["world_size"] != a.final_world_size:
            problems.append(f"final world size {d['world_size']}, expected {a.final_world_size}")
        if a.reference and d["test_accuracy"] is not None:
            ref = float(open(a.reference).read().strip())
            gap = 100 * (ref - d["test_accuracy"])
            print(f"reference accuracy {100 * ref:.2f}%, this run {gap:+.2f} points below (tolerance {a.tolerance})")
            if gap > a.tolerance:
                problems.append(f"test accuracy {100 * d['test_accuracy']:.2f}% is {gap:.2f} points below the "
                                f"failure-free {100 * ref:.2f}% (tolerance {a.tolerance})")
        if a.write_reference and d["test_accuracy"] is not None:
            with open(a.write_reference, "w") as f:
                f.write(f"{d['test_accuracy']}\n")
    if a.failures is not None and counts.get("failure", 0) != a.failures:
        problems.append(f"{counts.get('failure', 0)} failure events, expected {a.failures}")
    for spec in a.event:
        name, _, n = spec.partition(":")
        need = int(n) if n else 1
        if counts.get(name, 0) < need:
            problems.append(f"{counts.get(name, 0)} '{name}' events, expected at least {need}")
    for spec in a.field:
        lhs, _, want = spec.partition("=")
        name, _, key = lhs.partition(".")
        last = [e for e in events if e["event"] == name]
        got = last[-1].get(key) if last else None
        ok = field_matches(got, want) if last and key in last[-1] else False
        print(f"last {name}.{key} = {json.dumps(got)} (expected {want})")
        if not ok:
            problems.append(f"last '{name}' event has {key} = {got}, expected {want}")
    for e in events:
        if e["event"] in ("failure", "recovered"):
            print("  " + json.dumps({k: v for k, v in e.items() if k not in ("time", "unix_time")}))
    for p in problems:
        print("check_run: FAILED:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
