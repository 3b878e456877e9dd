#!/usr/bin/env python3
"""The end of a demo run (train-fashion-mnist.sh, train-torch-resnet.sh): its failures and recoveries and the
final test accuracy, from the run's metrics (JSON Lines).

usage: recovery-report.py METRICS
"""
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for e in lines:
    if e.get("event") == "failure":
        print(f"[sinew] failure at step {e['step'] + 1}: {e['from_world_size']} -> {e['from_world_size'] - e['lost']} ranks, "
              f"recovered in place (revoke+shrink+agree {e['revoke_ms'] + e['shrink_ms'] + e['agree_ms']:.1f} ms, "
              f"state sync {e['sync_ms']:.1f} ms, spawn {e['spawn_ms']:.0f} ms), {e['world_size']} ranks after")
    if e.get("event") == "recovered":
        print(f"[sinew] first step after the failure done {e['total_ms']:.1f} ms after it was detected")
done = [e for e in lines if e.get("event") == "done"][-1]
# A script's own loop evaluates in its own code (it prints its accuracy): the metrics have none then.
tested = any(e.get("event") == "eval" for e in lines)
accuracy = f"final test accuracy {100 * done['test_accuracy']:.2f}% after " if tested else "trained "
print(f"[sinew] {accuracy}{done['epochs']} epochs, "
      f"{done['steps']} steps, {done['world_size']} ranks at the end, {done['samples_per_s']:.0f} samples/s")
