#!/usr/bin/env python3
"""mpi_scripts/sinew-run's decisions, row by row of the launcher's table (docs/fault-tolerance.md: "Losing a
node, and the launcher that always ends a job", and the failure matrix's rows that end in sinew-run), from
the job's status records and the launcher's own report only; then the program end to end over a fake mpirun
that writes records and exits as a scenario says (no MPI needed).

    python3 tests/cli/test_sinew_run.py [-v] [Case.test_name]
"""
import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = os.path.join(ROOT, "mpi_scripts", "sinew-run")

_loader = importlib.machinery.SourceFileLoader("sinew_run", PROGRAM)
_spec = importlib.util.spec_from_loader("sinew_run", _loader)
sr = importlib.util.module_from_spec(_spec)
_loader.exec_module(sr)


def rec(event, process, **fields):
    """A status record as StatusReader gives it (core/status.hpp's fields, "_process": the file)."""
    r = {"event": event, "unix_time": 1.7e9, "host": process.split("-")[0], "pid": 1, "launch_rank": 0,
         "generation": 0}
    r.update(fields)
    r["_process"] = process + ".jsonl"
    return r


def starts(n, host="h1"):
    return [rec("start", f"{host}-{100 + i}", launch_rank=i) for i in range(n)]


def leaving(ranks, reason, host="h1"):
    """The relaunch records of the processes of launch ranks `ranks`."""
    return [rec("relaunch", f"{host}-{100 + i}", launch_rank=i, reason=reason, step=29) for i in ranks]


def report(*lines):
    """The launcher's report from its output lines."""
    r = sr.LauncherReport()
    for line in lines:
        r.feed(line.encode() + b"\n")
    return r


# PRRTE 3.0.8's message when it loses a node's daemon (help-errmgr-base.txt, [node-died]).
PRTE_LOST_H3 = """--------------------------------------------------------------------------
PRTE has lost communication with a remote daemon.

  HNP daemon   : [prterun-sinew-h1-1234@0,0] on node sinew-h1
  Remote daemon: [prterun-sinew-h1-1234@0,3] on node sinew-h3

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
--------------------------------------------------------------------------""".splitlines()

# Open MPI 4.1's mpirun when a rank dies (help-orterun.txt, proc-aborted-strsignal).
OMPI4_DEATH = "mpirun noticed that process rank 2 with PID 4242 on node host exited on signal 9 (Killed)."

HOSTFILE = "sinew-h1 slots=2\nsinew-h2 slots=2\nsinew-h3 slots=2\nsinew-h4 slots=2\n"


def mpirun(**kw):
    return sr.Settings(launcher="mpirun", **kw)


class LauncherTable(unittest.TestCase):
    """The table of docs/fault-tolerance.md, "the launch ended because | sinew-run relaunches | from"."""

    def test_a_node_lost_relaunches_on_the_hosts_left_though_mpirun_returned_0(self):
        # PRRTE ends the whole job, survivors included, and mpirun returns 0; nobody recorded complete.
        o = sr.Outcome(0, 8, starts(8), report(*PRTE_LOST_H3))
        d = sr.decide(o, mpirun(hostfile=True))
        self.assertEqual(d.action, sr.RELAUNCH)
        self.assertEqual(d.why, "node-lost")
        self.assertTrue(d.node_lost)
        self.assertFalse(d.complete)
        self.assertEqual(d.exclude, ["sinew-h3"])
        self.assertIn("node sinew-h3 lost: left out of the next launches", d.notes)
        self.assertIn("mpirun returned 0, but the job was ended by a lost node: not finished", d.notes)
        # The hostfile, read again, less the lost host: as many ranks as slots left.
        hosts = sr.hosts_left(HOSTFILE, d.exclude)
        self.assertEqual([h for h, _ in hosts], ["sinew-h1", "sinew-h2", "sinew-h4"])
        ranks, notes, stop = sr.plan_launch(d.ranks, sum(s for _, s in hosts), 1)
        self.assertEqual((ranks, stop), (6, None))
        self.assertEqual(notes, ["the hostfile has 6 slots left: 6 ranks"])

    def test_a_node_lost_without_a_hostfile_relaunches_as_before(self):
        d = sr.decide(sr.Outcome(0, 8, starts(8), report(*PRTE_LOST_H3)), mpirun(hostfile=False))
        self.assertEqual((d.action, d.ranks), (sr.RELAUNCH, 8))
        self.assertTrue(any("without --hostfile there is no list of hosts" in n for n in d.notes))

    def test_a_node_lost_under_srun_is_excluded_and_its_tasks_dropped(self):
        o = sr.Outcome(1, 4, starts(4), report("srun: error: Node failure on n2",
                                               "srun: error: n2: tasks 2-3: Killed"))
        d = sr.decide(o, sr.Settings(launcher="srun", slurm_nodes=2))
        self.assertEqual((d.action, d.why, d.ranks, d.exclude), (sr.RELAUNCH, "node-lost", 2, ["n2"]))

    def test_a_repair_deadline_relaunches_on_the_slots_left(self):
        # elastic.repair-deadline: rank 1 killed, the other three stuck in the shrink leave with exit 75.
        o = sr.Outcome(75, 4, starts(4) + leaving([0, 2, 3], "repair-deadline"))
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.why, d.ranks, d.lost), (sr.RELAUNCH, "ranks-lost", 3, 1))

    def test_a_repair_deadline_with_nobody_dead_keeps_the_size(self):
        o = sr.Outcome(75, 4, starts(4) + leaving(range(4), "repair-deadline"))
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.why, d.ranks, d.lost), (sr.RELAUNCH, "relaunch-asked", 4, 0))

    def test_a_killed_mpirun_relaunches_at_the_same_size_after_a_pause(self):
        # Orphans record that their launcher is gone: not survivors of a failure, so no rank counts as lost.
        o = sr.Outcome(137, 4, starts(4) + leaving(range(4), "launcher-gone"))
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.why, d.ranks, d.lost), (sr.RELAUNCH, "launcher-killed", 4, 0))
        self.assertEqual(d.pause, 1.0)
        self.assertIn("the launcher was ended by signal 9 with no rank reported lost: relaunching at the same size",
                      d.notes)

    def test_a_rank_dead_in_restart_mode_relaunches_on_the_slots_left(self):
        # Open MPI 5: the three survivors record that they leave after the failure.
        o = sr.Outcome(75, 4, starts(4) + leaving([0, 1, 3], "failure"))
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.ranks, d.lost), (sr.RELAUNCH, 3, 1))
        self.assertIn("job failed (exit 75), 1 rank(s) lost", d.notes)

    def test_a_rank_dead_under_open_mpi_4_is_counted_from_mpiruns_report(self):
        # Debian's Open MPI 4.1 kills the survivors at once: its mpirun names the dead rank.
        o = sr.Outcome(137, 4, starts(4), report(OMPI4_DEATH))
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.ranks, d.lost), (sr.RELAUNCH, 3, 1))


class FailureMatrix(unittest.TestCase):
    """The failure matrix's rows (docs/fault-tolerance.md) that sinew-run handles, beyond the table above."""

    def test_a_host_cut_off_on_the_management_network_too_is_a_lost_node(self):
        d = sr.decide(sr.Outcome(0, 8, starts(8), report(*PRTE_LOST_H3)), mpirun(hostfile=True))
        self.assertEqual((d.action, d.exclude), (sr.RELAUNCH, ["sinew-h3"]))

    def test_every_process_gone_without_complete_relaunches_at_the_same_size(self):
        # Three of four died, the last had no majority and fenced itself; mpirun returned 0.
        o = sr.Outcome(0, 4, starts(4) + [rec("cut-off", "h1-103", launch_rank=3)])
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.why, d.ranks), (sr.RELAUNCH, "ended", 4))
        self.assertIn("the launch ended (exit 0) without the job saying it trained to the end: not finished", d.notes)
        self.assertEqual(d.exclude, [])  # no hostfile: nothing to leave the host out of

    def test_a_cut_off_host_is_left_out_of_a_hostfiles_launches(self):
        o = sr.Outcome(0, 8, starts(8) + [rec("cut-off", "sinew-h2-7", host="sinew-h2")])
        d = sr.decide(o, mpirun(hostfile=True))
        self.assertEqual(d.exclude, ["sinew-h2"])
        self.assertIn("host sinew-h2 was cut off from the others: left out of the next launches", d.notes)
        self.assertFalse(d.node_lost)
        # Not twice: a host already left out.
        self.assertEqual(sr.decide(o, mpirun(hostfile=True), excluded=["sinew-h2"]).exclude, [])

    def test_done_then_a_non_zero_exit_is_finished(self):
        o = sr.Outcome(137, 4, starts(4) + [rec("complete", "h1-100", step=768, world_size=4)])
        d = sr.decide(o, mpirun(), generation=1)
        self.assertEqual((d.action, d.code, d.why), (sr.FINISH, 0, "complete"))
        self.assertIn("the job completed; the launcher's exit code 137 (a process that ended badly after it) does "
                      "not change that", d.notes)
        self.assertIn("job finished after 1 relaunches", d.notes)

    def test_done_then_a_launcher_that_does_not_return_is_finished(self):
        o = sr.Outcome(143, 4, starts(4) + [rec("complete", "h1-100", world_size=4)], stopped=True)
        self.assertEqual(sr.decide(o, mpirun()).action, sr.FINISH)

    def test_done_with_exit_0_is_finished(self):
        d = sr.decide(sr.Outcome(0, 4, starts(4) + [rec("complete", "h1-100", world_size=4)]), mpirun())
        self.assertEqual((d.action, d.code, d.notes), (sr.FINISH, 0, ["job finished after 0 relaunches"]))

    def test_below_the_jobs_min_ranks_relaunches_at_the_same_size(self):
        o = sr.Outcome(75, 4, starts(4) + leaving([0, 2, 3], "min-ranks"))
        d = sr.decide(o, mpirun())
        self.assertEqual((d.action, d.why, d.ranks), (sr.RELAUNCH, "relaunch-asked", 4))

    def test_a_stop_signal_relaunches_at_the_same_size(self):
        o = sr.Outcome(75, 4, starts(4) + leaving(range(4), "stop-signal"))
        self.assertEqual(sr.decide(o, mpirun()).ranks, 4)

    def test_below_sinew_runs_own_min_ranks_it_stops_with_75(self):
        ranks, notes, stop = sr.plan_launch(4, 2, 3)
        self.assertEqual((ranks, stop), (2, 75))
        self.assertIn("only 2 ranks left, below --min-ranks 3: stopping; relaunch with more ranks to continue", notes)
        self.assertEqual(sr.plan_launch(3, None, 3), (3, [], None))


class Rules(unittest.TestCase):
    """Exit codes and bounds: the job's own errors, --max-restarts, --spares, --launch-timeout, srun."""

    def test_usage_data_and_checkpoint_errors_are_never_relaunched(self):
        for code in (2, 3, 4):
            d = sr.decide(sr.Outcome(code, 4, starts(4)), mpirun())
            self.assertEqual((d.action, d.code), (sr.STOP, code))

    def test_max_restarts_gives_up_with_the_last_exit_code(self):
        o = sr.Outcome(1, 4, starts(4))
        self.assertEqual(sr.decide(o, mpirun(max_restarts=2), generation=1).action, sr.RELAUNCH)
        d = sr.decide(o, mpirun(max_restarts=2), generation=2)
        self.assertEqual((d.action, d.code), (sr.STOP, 1))
        self.assertIn("giving up after 2 relaunches", d.notes)

    def test_a_failure_nobody_explains_counts_one_rank_lost(self):
        d = sr.decide(sr.Outcome(1, 4, starts(4)), mpirun())
        self.assertEqual((d.action, d.ranks, d.lost), (sr.RELAUNCH, 3, 1))

    def test_a_relaunch_keeps_more_processes_than_spares(self):
        o = sr.Outcome(75, 3, starts(3) + leaving([0], "failure"))
        d = sr.decide(o, mpirun(spares=2))
        self.assertEqual(d.ranks, 3)
        self.assertIn("keeping 3 processes for --spares 2", d.notes)

    def test_a_launch_past_its_timeout_is_relaunched_at_the_same_size(self):
        d = sr.decide(sr.Outcome(124, 4, starts(4), timed_out=True), mpirun(launch_timeout=60))
        self.assertEqual((d.action, d.why, d.ranks), (sr.RELAUNCH, "timeout", 4))
        self.assertIn("launch 0 ran past --launch-timeout 60s and was killed", d.notes)

    def test_a_failed_srun_step_is_relaunched_at_the_same_size(self):
        o = sr.Outcome(137, 4, starts(4), report("srun: error: n1: task 2: Killed",
                                                 "srun: error: n1: tasks 0-1,3: Killed"))
        d = sr.decide(o, sr.Settings(launcher="srun"))
        self.assertEqual((d.action, d.why, d.ranks, d.lost), (sr.RELAUNCH, "step-failed", 4, 0))
        self.assertIn("job step failed (exit 137; srun reported 2 task exits): relaunching at the same size", d.notes)

    def test_more_survivors_than_launched_lose_nobody(self):
        # Spawned replacements stuck with the others: as many or more processes than launched.
        o = sr.Outcome(75, 4, leaving(range(5), "repair-deadline"))
        self.assertEqual(sr.decide(o, mpirun()).ranks, 4)


class NoLogText(unittest.TestCase):
    """The job's lines are not the launcher's report, and records are the only source of the job's status."""

    def test_the_jobs_lines_change_nothing(self):
        r = report("[sinew] job complete: trained to the end at step 768",
                   "sinew: error: ...; exiting for a relaunch from the latest checkpoint (--elastic restart)",
                   "[sinew] heard nothing for 3000 ms from 3 of the 4 processes of the group: this process (9 on "
                   "h2) is cut off from the others, and fences itself (SIGKILL) so that they go on without it")
        self.assertEqual((r.lost_nodes, r.signal_deaths, r.task_exits), ([], 0, 0))
        d = sr.decide(sr.Outcome(0, 4, starts(4), r), mpirun(hostfile=True))
        self.assertEqual((d.action, d.complete, d.exclude), (sr.RELAUNCH, False, []))

    def test_the_program_reads_none_of_the_jobs_sentences(self):
        with open(PROGRAM) as f:
            code = f.read()
        for sentence in ("job complete:", "exiting for a relaunch", "is cut off from the others",
                         "stuck inside the MPI library"):
            self.assertFalse(sentence in code, f"sinew-run knows the job's sentence '{sentence}'")


class Records(unittest.TestCase):
    def test_the_reader_takes_whole_lines_as_files_grow(self):
        with tempfile.TemporaryDirectory() as d:
            r = sr.StatusReader(d)
            self.assertEqual(r.poll(), [])
            with open(f"{d}/h1-7.jsonl", "w") as f:
                f.write('{"event":"start","host":"h1"}\n{"event":"comp')
            self.assertEqual([x["event"] for x in r.poll()], ["start"])
            with open(f"{d}/h1-7.jsonl", "a") as f:
                f.write('lete","world_size":4}\nnot json\n[1]\n')
            with open(f"{d}/h2-8.jsonl", "w") as f:
                f.write('{"event":"relaunch","reason":"failure"}\n')
            recs = r.poll()
            self.assertEqual([(x["event"], x["_process"]) for x in recs],
                             [("start", "h1-7.jsonl"), ("complete", "h1-7.jsonl"), ("relaunch", "h2-8.jsonl")])
            self.assertTrue(sr.completed(recs))
            self.assertEqual(sr.survivors(recs), 1)

    def test_a_missing_directory_reads_as_no_records(self):
        self.assertEqual(sr.StatusReader("/nonexistent/sinew").poll(), [])

    def test_one_process_with_two_relaunch_records_is_one_survivor(self):
        recs = leaving([1], "failure") + leaving([1], "repair-deadline")
        self.assertEqual(sr.survivors(recs), 1)


class CommandLine(unittest.TestCase):
    def test_own_options_job_options_and_the_program(self):
        o = sr.parse_args(["-n", "8", "--hostfile", "h", "--algorithm", "bytegrad", "--progress", "--lr=0.1",
                           "--spares", "1", "--", "prog", "--epochs", "2"])
        self.assertEqual((o.np, o.hostfile), ("8", "h"))
        self.assertEqual(o.job_opts, ["--algorithm", "bytegrad", "--progress", "--lr=0.1", "--spares", "1"])
        self.assertEqual(o.program, ["prog", "--epochs", "2"])
        self.assertEqual(sr.spares_of(o.job_opts + o.program[1:]), 1)
        self.assertEqual(sr.spares_of(["--spares=2"]), 2)

    def test_usage_errors(self):
        for argv, text in ((["-n"], "option '-n' needs a value"), (["-n", "2"], "no program given"),
                           (["-n", "x", "--", "p"], "take whole numbers"), (["p"], "unknown option 'p'"),
                           (["--launcher", "ssh", "--", "p"], "--launcher takes auto, mpirun or srun")):
            with self.assertRaises(sr.UsageError) as e:
                sr.parse_args(argv)
            self.assertIn(text, str(e.exception))

    def test_python_programs(self):
        self.assertTrue(sr.is_python("/usr/bin/python3"))
        self.assertTrue(sr.is_python("train.py"))
        self.assertFalse(sr.is_python("build/apps/sinew-train"))

    def test_hostfile(self):
        text = "# nodes\nn1 slots=4\nn2  # one slot\n\nn3 slots=2 max_slots=8\n"
        self.assertEqual(sr.hosts_left(text), [("n1", 4), ("n2", 1), ("n3", 2)])
        self.assertEqual(sr.hosts_left(text, ["n1"]), [("n2", 1), ("n3", 2)])


# ---- the program end to end, over a fake mpirun ---------------------------------------------------------

# Called as `--mpirun "python3 FAKE"`: reads -n, SINEW_STATUS_DIR and SINEW_RESTART_GENERATION; does what the
# scenario file (FAKE_SCENARIO, a JSON list: one entry per generation, the last repeated) says: write records
# as processes, print launcher lines, sleep, exit with a code.
FAKE = r'''
import json, os, sys, time
args = sys.argv[1:]
n = int(args[args.index("-n") + 1])
gen = int(os.environ["SINEW_RESTART_GENERATION"])
d = os.environ["SINEW_STATUS_DIR"]
plan = json.load(open(os.environ["FAKE_SCENARIO"]))
s = plan[min(gen, len(plan) - 1)]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"gen": gen, "n": n, "args": args, "dir": d}) + "\n")
def record(rank, event, **kw):
    with open(f"{d}/h1-{1000 * gen + rank}.jsonl", "a") as f:
        f.write(json.dumps(dict(event=event, host="h1", pid=1000 * gen + rank, launch_rank=rank, **kw)) + "\n")
for r in range(n):
    record(r, "start")
for line in s.get("print", []):
    print(line, flush=True)
for r in s.get("relaunch", []):
    record(r, "relaunch", reason=s.get("reason", "failure"))
if s.get("complete"):
    record(0, "complete", world_size=n)
time.sleep(s.get("sleep", 0))
sys.exit(s.get("code", 0))
'''


def jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


class EndToEnd(unittest.TestCase):
    def run_job(self, scenario, *options, timeout=60, env=None):
        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/fake.py", "w") as f:
                f.write(FAKE)
            with open(f"{d}/scenario.json", "w") as f:
                json.dump(scenario, f)
            e = dict(os.environ, FAKE_SCENARIO=f"{d}/scenario.json", FAKE_LOG=f"{d}/calls.jsonl")
            e.pop("SLURM_JOB_ID", None)
            e.update(env or {})
            p = subprocess.run([sys.executable, PROGRAM, "--mpirun", f"{sys.executable} {d}/fake.py",
                                "--events", f"{d}/events.jsonl", "--state-mirror", "none", *options,
                                "--", "prog", "--epochs", "1"], env=e, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout, cwd=d)
            calls, events = jsonl(f"{d}/calls.jsonl"), jsonl(f"{d}/events.jsonl")
            left = [n for n in os.listdir(d) if n.startswith(".sinew-run-")]
            return p, calls, events, left

    def test_a_restart_mode_failure_then_the_end(self):
        p, calls, events, left = self.run_job([{"relaunch": [0, 1, 3], "code": 75}, {"complete": True}], "-n", "4")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([c["n"] for c in calls], [4, 3])
        self.assertEqual(events[0], {**events[0], "event": "launch", "generation": 0, "ranks": 4})
        self.assertEqual(events[1], {**events[1], "event": "exit", "generation": 0, "code": 75, "lost": 1,
                                     "node_lost": 0, "complete": 0, "why": "ranks-lost"})
        self.assertEqual(events[3], {**events[3], "event": "exit", "code": 0, "complete": 1, "why": "complete"})
        self.assertIn("[sinew-supervise] launch 1: 3 ranks", p.stderr)
        # Every launch: its own status directory, the generation, the job's options after its own.
        self.assertNotEqual(calls[0]["dir"], calls[1]["dir"])
        self.assertEqual(calls[0]["args"][-5:], ["prog", "--epochs", "1", "--resume", "auto"])
        self.assertIn("SINEW_STATUS_DIR", calls[0]["args"])
        self.assertEqual(left, [], "the status folder was not removed")

    def test_the_jobs_log_lines_do_not_finish_it(self):
        p, calls, events, _ = self.run_job([{"print": ["[sinew] job complete: trained to the end at step 5"]}],
                                           "-n", "2", "--max-restarts", "1")
        self.assertEqual(p.returncode, 0)  # the last exit code, after giving up
        self.assertEqual(len(calls), 2)
        self.assertIn("giving up after 1 relaunches", p.stderr)
        self.assertIn("[sinew] job complete: trained to the end at step 5", p.stdout)  # passed on to people

    def test_a_lost_node_from_prrtes_report(self):
        with tempfile.TemporaryDirectory() as h:
            with open(f"{h}/hosts", "w") as f:
                f.write(HOSTFILE)
            p, calls, events, _ = self.run_job([{"print": PRTE_LOST_H3}, {"complete": True}], "--hostfile",
                                               f"{h}/hosts")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([c["n"] for c in calls], [8, 6])
        self.assertIn("node sinew-h3 lost", p.stderr)
        self.assertEqual(events[1]["node_lost"], 1)

    def test_a_flood_is_held_back_and_the_report_behind_it_still_read(self):
        flood = [f"NBC_Progress: an error 75 was found during schedule 0x55d{i:x} at row-offset {i}" for i in range(20000)]
        with tempfile.TemporaryDirectory() as h:
            with open(f"{h}/hosts", "w") as f:
                f.write(HOSTFILE)
            p, calls, events, _ = self.run_job([{"print": flood + PRTE_LOST_H3}, {"complete": True}], "--hostfile",
                                               f"{h}/hosts")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([c["n"] for c in calls], [8, 6])
        self.assertIn("[sinew] 19980 more lines like: NBC_Progress: an error # was found during schedule #", p.stdout)
        self.assertLess(p.stdout.count("NBC_Progress"), 30)

    def test_a_job_error_is_not_relaunched(self):
        p, calls, _, _ = self.run_job([{"code": 3}])
        self.assertEqual((p.returncode, len(calls)), (3, 1))

    def test_below_min_ranks(self):
        p, calls, _, _ = self.run_job([{"relaunch": [0], "code": 75}], "-n", "3", "--min-ranks", "2")
        self.assertEqual((p.returncode, len(calls)), (75, 1))
        self.assertIn("below --min-ranks 2", p.stderr)

    def test_a_launcher_that_does_not_return_after_complete_is_stopped(self):
        t = time.monotonic()
        p, calls, events, _ = self.run_job([{"complete": True, "sleep": 60}], "--exit-grace", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertLess(time.monotonic() - t, 20)
        self.assertIn("the job completed, but the launcher has not returned 1s later: stopping it", p.stderr)

    def test_a_hung_launch_past_its_timeout(self):
        p, calls, events, _ = self.run_job([{"sleep": 60}, {"complete": True}], "-n", "2", "--launch-timeout", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual([c["n"] for c in calls], [2, 2])
        self.assertEqual(events[1]["code"], 124)

    def test_a_python_program_gets_the_options_in_its_environment(self):
        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/fake.py", "w") as f:
                f.write("import json, os, sys\nd = os.environ['SINEW_STATUS_DIR']\n"
                        "open(d + '/h-1.jsonl', 'w').write(json.dumps({'event': 'complete'}) + '\\n')\n"
                        "print('OPTIONS=' + os.environ['SINEW_OPTIONS'])\nprint('ARGS=' + ' '.join(sys.argv[1:]))\n")
            p = subprocess.run([sys.executable, PROGRAM, "--mpirun", f"{sys.executable} {d}/fake.py",
                                "--state-mirror", "none", "--spares", "1", "--", "python3", "train.py", "--lr", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60,
                               cwd=d)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("OPTIONS=--spares 1 --resume auto", p.stdout)
        self.assertIn("-x SINEW_OPTIONS", p.stdout)
        self.assertTrue(p.stdout.rstrip().endswith("-n 4 python3 train.py --lr 1"), p.stdout)

    def test_a_signal_is_passed_to_the_launch_and_ends_the_run(self):
        with tempfile.TemporaryDirectory() as d:
            with open(f"{d}/fake.py", "w") as f:
                f.write("import signal, sys, time\n"
                        "signal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(75)))\n"
                        "print('started', flush=True)\ntime.sleep(60)\n")
            p = subprocess.Popen([sys.executable, PROGRAM, "--mpirun", f"{sys.executable} {d}/fake.py",
                                  "--state-mirror", "none", "--", "prog"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, universal_newlines=True, cwd=d)
            self.assertEqual(p.stdout.readline().strip(), "started")
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 128 + signal.SIGTERM, err)
        self.assertIn("got TERM", out)
        self.assertIn("not relaunching", err)

    def test_help_and_the_second_name(self):
        for name in ("sinew-run", "sinew-supervise"):
            p = subprocess.run([os.path.join(ROOT, "mpi_scripts", name), "--help"], stdout=subprocess.PIPE,
                               universal_newlines=True, timeout=30)
            self.assertEqual(p.returncode, 0)
            for opt in ("--hostfile", "--launcher", "--status-dir", "Exit codes"):
                self.assertIn(opt, p.stdout)


if __name__ == "__main__":
    unittest.main()
