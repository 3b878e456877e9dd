// The teachers' autoscaler: starts and stops teacher processes (sinew-teacher serve) on this host so that
// the students of a job wait for teacher logits at most a target fraction of their step time, with as few
// teachers as that allows. It reads what the students and teachers publish in the registry (etcd):
//   /sinew/<job>/students/<id>  {"student", "wait_ms_per_step", "step_ms", "samples_per_s",
//   "missing_fraction"} /sinew/<job>/teachers/<id>  {"id", "address", "model", "classes", "dataset",
//   "samples_per_s", "pid", "step"}
// docs/distillation.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace sinew::serve {

/// What the autoscaler runs and within which bounds.
struct AutoscaleOptions {
  std::string registry;  ///< etcd endpoint, e.g. http://127.0.0.1:2379
  std::string job;       ///< registry namespace: /sinew/<job>/
  /// argv of one teacher process; it must register itself under teachers_prefix(job) with its "pid".
  std::vector<std::string> teacher_command;
  /// taskset -c lists, one per teacher slot ("1", "2-3"): two teachers never share one. Empty: not pinned.
  /// When given, max_teachers is at most its size.
  std::vector<std::string> cpus;
  int min_teachers = 1;
  int max_teachers = 4;
  double target_wait_fraction = 0.05;  ///< students' total wait for logits / their total step time
  double interval_s = 1.0;             ///< observation period
  /// After a change, no other change for this long (and a started teacher must have registered).
  double cooldown_s = 4.0;
  std::string events;     ///< JSON Lines file of observations and decisions (empty: none)
  double duration_s = 0;  ///< stop after this long (0: until stop())
};

/// One observation of the registry.
struct Observation {
  int students = 0;
  double wait_fraction = 0;         ///< sum of the students' wait_ms_per_step / sum of their step_ms
  double demand = 0;                ///< students' samples/s, sum
  int teachers = 0;                 ///< teachers registered (not those being stopped)
  double capacity = 0;              ///< teachers' measured samples/s, sum
  double min_teacher_capacity = 0;  ///< the smallest of them (0 when one is not measured yet)
  /// Students' mean fraction of logits that came too late or not at all (none there to wait for: with no
  /// teacher a student's request fails at once, so its wait stays low while it misses every logit).
  double missing_fraction = 0;
};

enum class Action { kNone, kStart, kStop };

struct Decision {
  Action action = Action::kNone;
  std::string reason;
};

/// The policy, a pure function of one observation; `running` counts the teachers this autoscaler runs (not
/// those being stopped), `cooling_down` is true within cooldown_s of the last change or while a started
/// teacher has not registered yet. In order:
///   - fewer than min_teachers running: start one (even while cooling down: the minimum is always kept);
///   - cooling down: nothing;
///   - wait_fraction or missing_fraction > target: start one, unless max_teachers are running;
///   - both < target / 4, more than min_teachers running, and the capacity left without the smallest
///     teacher still covers 1.25 x the demand: stop one.
/// Autoscaler::run() adds one rule decide() cannot see: a teacher started next to others, while the
/// students waited, must make the students faster by at least half of what an average teacher gave them;
/// if it does not (teachers sharing cores, a saturated host or network), it is stopped again and no more
/// teachers than before are started for 60 s. The students' own throughput is the judge: teachers
/// measure only their compute rate, which does not drop when two of them take turns on one core.
/// The hysteresis: between target / 4 and target nothing changes, so a wait hovering around the target
/// does not flap; a teacher is only stopped when the others measurably cover the demand with a margin
/// (a stop that pushes the wait back over the target would be undone one cooldown later); and the cooldown
/// lets the students' windowed reports show the effect of a change before the next one.
Decision decide(const Observation& o, int running, bool cooling_down, const AutoscaleOptions& opt);

/// Runs the policy against the registry and the teacher processes it starts (posix_spawn, each pinned
/// to its own cpus slot with taskset). Not copyable; run() on one thread, stop() from any.
class Autoscaler {
 public:
  /// Validates the options: InvalidArgument naming the option. Starts nothing yet.
  explicit Autoscaler(AutoscaleOptions o);
  /// Stops every teacher it started: SIGTERM, at most 5 s to exit, then SIGKILL. Call after run() returned.
  ~Autoscaler();
  Autoscaler(const Autoscaler&) = delete;
  Autoscaler& operator=(const Autoscaler&) = delete;

  /// Observes, decides and acts every interval_s until stop() or duration_s. ServiceError when the
  /// registry does not answer at the start; later failed observations are logged and skipped (nothing
  /// changes on them). The teachers keep running when it returns (the destructor stops them).
  void run();
  /// Makes run() return within moments. Thread-safe; not async-signal-safe (call it from a thread that
  /// waits for the signals).
  void stop();
  /// Teachers started and not stopped (alive, or starting).
  [[nodiscard]] int running() const;

 private:
  struct Child {
    int pid = 0;
    int slot = 0;
    double started_s = 0;
    bool registered = false;
    double registered_s = 0;
    bool stopping = false;
    double stop_sent_s = 0;
    bool killed = false;
    bool overdue = false;  // not registered within the time allowed (warned once)
  };

  void act(double now, const Observation& o, const std::set<int>& registered_pids);
  void start_teacher(double now, const Observation& o, const std::string& reason);
  void stop_teacher(double now, const Observation& o, const std::string& reason);
  void reap(double now);
  void stop_all();
  void event(double now, const char* name, const Observation& o, const std::string& reason, int pid = 0,
             const std::string& cpu = {}, bool failed = false);
  [[nodiscard]] double now_s() const;

  AutoscaleOptions opt_;
  std::vector<Child> children_;  // run()'s thread and the destructor only
  std::atomic<int> running_{0};
  double last_change_s_ = -1e300;
  double last_unexpected_exit_s_ = -1e300;
  std::FILE* events_ = nullptr;
  double start_s_ = 0;
  Observation last_;  // the latest observation, for the events between observations
  /// The capacity before the last start next to running teachers, to check that the start paid off.
  struct Probe {
    int pid = 0;               ///< the teacher started
    double demand_before = 0;  ///< the students' samples/s then (they were waiting for logits)
    int students = 0;
    int teachers_before = 0;
  };
  std::optional<Probe> probe_;
  int ceiling_ = 0;  // while now < ceiling_until_s_: at most this many teachers
  double ceiling_until_s_ = -1e300;

  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> cancel_{false};  // stop(): given to the registry client
};

}  // namespace sinew::serve
