#!/usr/bin/env python3
"""mpi_scripts/limit-repeats.py: a flood of alike lines is cut to --keep of them plus a count; other lines,
and the lines named by --always, all pass, in order."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "mpi_scripts", "limit-repeats.py")

flood = [f"NBC_Progress: an error 75 was found during schedule 0x55d{i:x} at row-offset {i} - aborting the schedule"
         for i in range(50000)]
leave = "[sinew] revoke and shrink (attempt 1) did not return within 8.0 s: ... exiting for a relaunch from the latest checkpoint"
lines = ["start"] + flood[:10000] + [leave] * 30 + flood[10000:] + ["done: 128 steps"]
out = subprocess.run([sys.executable, SCRIPT, "--keep", "5", "--always", "exiting for a relaunch"],
                     input="\n".join(lines) + "\n", capture_output=True, text=True, check=True).stdout.splitlines()
problems = []
if out[0] != "start" or out[1:6] != flood[:5]:
    problems.append(f"the first lines are not passed as they are: {out[:6]}")
if out.count(leave) != 30:
    problems.append(f"{out.count(leave)} of the 30 --always lines passed")
if "done: 128 steps" not in out[-2:]:
    problems.append(f"the line after the flood is missing or out of place: {out[-3:]}")
counted = [line for line in out if line.startswith("[sinew] ") and "more line" in line]
held = sum(int(line.split()[1]) for line in counted)
if held != len(flood) - 5:
    problems.append(f"held back {held} lines, expected {len(flood) - 5}: {counted}")
if counted and "NBC_Progress: an error # was found during schedule # at row-offset #" not in counted[-1]:
    problems.append(f"the count does not show the kind of line: {counted[-1]}")
if len(out) > 5 + 30 + 3 + len(counted):
    problems.append(f"{len(out)} lines came through")
for p in problems:
    print("FAIL:", p)
print("ok" if not problems else f"{len(problems)} problems")
sys.exit(1 if problems else 0)
