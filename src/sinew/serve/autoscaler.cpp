#include "sinew/serve/autoscaler.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/serve/etcd.hpp"
#include "sinew/serve/service_source.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): posix_spawn's environment

namespace sinew::serve {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// A teacher is only stopped when the others cover this multiple of the students' demand: their measured
/// rates are past averages, and a stop that turns out short costs a cooldown of waiting students.
constexpr double kStopMargin = 1.25;
/// Stop only below target x this: the lower edge of the hysteresis band.
constexpr double kStopBelow = 0.25;
/// A stopped teacher gets this long to revoke its lease and exit before SIGKILL.
constexpr double kTermGraceS = 5.0;
/// A started teacher not registered after this long (a very slow model load, or a command that never
/// registers) no longer holds back other changes; it keeps running and is warned about once.
constexpr double kRegisterWithinS = 120.0;
/// Children are reaped (and stopped ones killed when late) this often, between observations.
constexpr auto kReapEvery = 100ms;
/// A teacher started while others ran must make the students faster by at least this share of what an
/// average teacher gave them; one that does less (teachers sharing cores, a saturated host) is stopped
/// again ...
constexpr double kMinGain = 0.5;
/// ... and for this long no more teachers than the ones before it are started.
constexpr double kCeilingHoldS = 60.0;
/// The shortest time a new teacher is registered before its gain is judged.
constexpr double kProbeSettleS = 2.0;
/// One registry request; an observation takes two.
constexpr auto kEtcdTimeout = 3s;

/// What the registry says in one observation; teacher_pids matches registered teachers to children.
struct Registry {
  Observation o;
  std::set<int> teacher_pids;
};

/// Reads both prefixes. Entries that do not parse are skipped (warned about once per key): a student that
/// has not reported yet has only {"student"}, a teacher that has not served yet has samples_per_s 0.
/// Teachers with a pid in `leaving` (stopped, not exited yet) are not counted: their capacity is going.
Registry read_registry(Etcd& etcd, const std::string& job, const std::set<int>& leaving,
                       std::set<std::string>& warned) {
  Registry r;
  const auto students = etcd.list(students_prefix(job));
  const auto teachers = etcd.list(teachers_prefix(job));
  double wait_ms = 0, step_ms = 0, missing = 0;
  int reporting = 0;
  for (const auto& kv : students) {
    ++r.o.students;
    try {
      const auto j = nlohmann::json::parse(kv.value);
      const double step = j.value("step_ms", 0.0);
      r.o.demand += j.value("samples_per_s", 0.0);
      if (step <= 0) continue;
      wait_ms += j.value("wait_ms_per_step", 0.0);
      step_ms += step;
      missing += j.value("missing_fraction", 0.0);
      ++reporting;
    } catch (const nlohmann::json::exception& e) {
      if (warned.insert(kv.key).second)
        spdlog::warn("autoscale: student entry {} is unreadable: {}", kv.key, e.what());
    }
  }
  r.o.wait_fraction = step_ms > 0 ? wait_ms / step_ms : 0;
  r.o.missing_fraction = reporting > 0 ? missing / reporting : 0;
  double smallest = std::numeric_limits<double>::infinity();
  for (const auto& kv : teachers) {
    try {
      const auto j = nlohmann::json::parse(kv.value);
      const int pid = j.contains("pid") && j["pid"].is_number_integer() ? j["pid"].get<int>() : 0;
      if (pid != 0 && leaving.contains(pid)) continue;
      if (pid != 0) r.teacher_pids.insert(pid);
      const double rate = std::max(0.0, j.value("samples_per_s", 0.0));
      ++r.o.teachers;
      r.o.capacity += rate;
      smallest = std::min(smallest, rate);
    } catch (const nlohmann::json::exception& e) {
      ++r.o.teachers;
      smallest = 0;
      if (warned.insert(kv.key).second)
        spdlog::warn("autoscale: teacher entry {} is unreadable: {}", kv.key, e.what());
    }
  }
  r.o.min_teacher_capacity = r.o.teachers > 0 ? smallest : 0;
  return r;
}

/// `name` as posix_spawnp would find it: a path, or a file in $PATH, executable either way.
bool executable(const std::string& name) {
  if (name.empty()) return false;
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): read only
  std::string_view dirs = path != nullptr ? path : "/usr/bin:/bin";
  while (!dirs.empty()) {
    const auto colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    dirs = colon == std::string_view::npos ? std::string_view() : dirs.substr(colon + 1);
    if (::access(((dir.empty() ? "." : dir) + "/" + name).c_str(), X_OK) == 0) return true;
  }
  return false;
}

/// strerror() and strsignal() are not thread-safe, and the caller may run other threads.
std::string errno_text(int err) { return std::generic_category().message(err); }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exit code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
    if (const char* name = ::sigabbrev_np(WTERMSIG(status)); name != nullptr) {
      return fmt::format("killed by signal {} (SIG{})", WTERMSIG(status), name);
    }
#endif
    return fmt::format("killed by signal {}", WTERMSIG(status));
  }
  return fmt::format("status {}", status);
}

}  // namespace

Decision decide(const Observation& o, int running, bool cooling_down, const AutoscaleOptions& opt) {
  const double target = opt.target_wait_fraction;
  if (running < opt.min_teachers) {
    return {Action::kStart,
            fmt::format("{} teachers running, fewer than the minimum {}", running, opt.min_teachers)};
  }
  if (cooling_down) return {Action::kNone, "cooling down after the last change"};
  const bool waiting = o.wait_fraction > target;
  if (waiting || o.missing_fraction > target) {
    const auto what =
        waiting ? fmt::format("students wait {:.1f}% of their step time for logits", 100 * o.wait_fraction)
                : fmt::format("students miss {:.1f}% of their logits", 100 * o.missing_fraction);
    if (running >= opt.max_teachers) {
      return {Action::kNone, fmt::format("{}, over the target {:.1f}%, but the maximum of {} teachers run",
                                         what, 100 * target, opt.max_teachers)};
    }
    return {Action::kStart, fmt::format("{}, over the target {:.1f}%", what, 100 * target)};
  }
  if (o.wait_fraction < kStopBelow * target && o.missing_fraction < kStopBelow * target &&
      running > opt.min_teachers) {
    const double left = o.capacity - o.min_teacher_capacity;
    if (left >= kStopMargin * o.demand) {
      return {Action::kStop,
              fmt::format("students wait {:.1f}% (under {:.1f}%), and {:.0f} samples/s would be left "
                          "for a demand of {:.0f}",
                          100 * o.wait_fraction, 100 * kStopBelow * target, left, o.demand)};
    }
    return {Action::kNone,
            fmt::format("students wait little, but without one teacher {:.0f} samples/s would be left "
                        "for a demand of {:.0f} (x{} needed)",
                        left, o.demand, kStopMargin)};
  }
  return {Action::kNone, "within the target"};
}

Autoscaler::Autoscaler(AutoscaleOptions o) : opt_(std::move(o)) {
  if (opt_.registry.empty())
    SINEW_THROW(InvalidArgument, "autoscale: --registry (the etcd endpoint) is required");
  if (opt_.job.empty() || opt_.job.find('/') != std::string::npos) {
    SINEW_THROW(InvalidArgument, "autoscale: --job '{}' must be a non-empty name without '/'", opt_.job);
  }
  if (opt_.teacher_command.empty() || !executable(opt_.teacher_command.front())) {
    SINEW_THROW(InvalidArgument, "autoscale: the teacher command '{}' is not an executable",
                opt_.teacher_command.empty() ? std::string() : opt_.teacher_command.front());
  }
  if (opt_.min_teachers < 0 || opt_.max_teachers < 1 || opt_.min_teachers > opt_.max_teachers) {
    SINEW_THROW(InvalidArgument,
                "autoscale: --min-teachers {} and --max-teachers {} need 0 <= min <= max, max >= 1",
                opt_.min_teachers, opt_.max_teachers);
  }
  for (const auto& c : opt_.cpus) {
    if (c.empty() || c.find_first_not_of("0123456789,-") != std::string::npos) {
      SINEW_THROW(InvalidArgument,
                  "autoscale: --cpus entry '{}' is not a taskset -c list (e.g. 3 or 2-3 or 1,5)", c);
    }
  }
  if (!opt_.cpus.empty()) {
    if (static_cast<std::size_t>(opt_.max_teachers) > opt_.cpus.size()) {
      SINEW_THROW(
          InvalidArgument,
          "autoscale: --max-teachers {} is more than the {} --cpus slots: two teachers would share cpus",
          opt_.max_teachers, opt_.cpus.size());
    }
    if (!executable("taskset"))
      SINEW_THROW(InvalidArgument, "autoscale: --cpus needs taskset (util-linux) in PATH");
  }
  if (!(opt_.target_wait_fraction > 0 && opt_.target_wait_fraction < 1)) {
    SINEW_THROW(InvalidArgument, "autoscale: --target-wait {} must lie in (0, 1)", opt_.target_wait_fraction);
  }
  if (!(opt_.interval_s > 0))
    SINEW_THROW(InvalidArgument, "autoscale: --interval {} must be > 0", opt_.interval_s);
  if (!(opt_.cooldown_s >= 0))
    SINEW_THROW(InvalidArgument, "autoscale: --cooldown {} must be >= 0", opt_.cooldown_s);
  if (!(opt_.duration_s >= 0))
    SINEW_THROW(InvalidArgument, "autoscale: --duration {} must be >= 0", opt_.duration_s);
  if (!opt_.events.empty()) {
    // "e": the teachers must not inherit it.
    events_ = std::fopen(opt_.events.c_str(), "we");
    if (events_ == nullptr) {
      SINEW_THROW(InvalidArgument, "autoscale: cannot write --events {}: {}", opt_.events, errno_text(errno));
    }
  }
  start_s_ = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

Autoscaler::~Autoscaler() {
  try {
    stop_all();
  } catch (const std::exception& e) {
    spdlog::error("autoscale: stopping the teachers: {}", e.what());
  }
  if (events_ != nullptr) std::fclose(events_);
}

double Autoscaler::now_s() const {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count() - start_s_;
}

int Autoscaler::running() const { return running_.load(); }

void Autoscaler::stop() {
  {
    const std::lock_guard lock(mu_);
    stop_ = true;
  }
  cancel_.store(true);  // a registry request in flight gives up at once
  wake_.notify_all();
}

void Autoscaler::run() {
  start_s_ = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();  // the events' t = 0
  Etcd etcd(opt_.registry, kEtcdTimeout, &cancel_);
  if (!etcd.healthy()) {
    if (cancel_.load()) return;
    SINEW_THROW(ServiceError,
                "autoscale: the registry at {} does not answer: start etcd there (hpc/etcd/etcd.sh up)",
                opt_.registry);
  }
  spdlog::info(
      "autoscale: job '{}' at {}: {}..{} teachers, students' wait for logits under {:.1f}% of their step",
      opt_.job, opt_.registry, opt_.min_teachers, opt_.max_teachers, 100 * opt_.target_wait_fraction);
  std::set<std::string> warned;
  const auto until = [this] {
    return opt_.duration_s > 0 ? opt_.duration_s : std::numeric_limits<double>::infinity();
  };
  double next_observation = now_s();
  for (;;) {
    const double now = now_s();
    if (now >= until()) break;
    reap(now);
    if (now >= next_observation) {
      // Fixed ticks, not "interval after the last": the events' times stay evenly spaced.
      next_observation += opt_.interval_s * (std::floor((now - next_observation) / opt_.interval_s) + 1);
      std::optional<Registry> r;
      try {
        std::set<int> leaving;
        for (const auto& c : children_) {
          if (c.stopping) leaving.insert(c.pid);
        }
        r = read_registry(etcd, opt_.job, leaving, warned);
      } catch (const ServiceError& e) {
        if (cancel_.load()) break;  // stop() cut the request short
        // Nothing changes on a failed observation: the registry may be back at the next.
        spdlog::warn("autoscale: observing the registry failed: {}", e.message());
        event(now, "observe", Observation{}, "registry: " + e.message(), 0, {}, true);
      }
      if (r) act(now, r->o, r->teacher_pids);
    }
    std::unique_lock lock(mu_);
    const double wake =
        std::min({next_observation, until(), now_s() + std::chrono::duration<double>(kReapEvery).count()});
    wake_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, wake - now_s())),
                   [this] { return stop_; });
    if (stop_) break;
  }
  reap(now_s());
}

void Autoscaler::act(double now, const Observation& o, const std::set<int>& registered_pids) {
  last_ = o;
  bool pending = false;
  for (auto& c : children_) {
    if (c.stopping || c.registered) continue;
    if (registered_pids.contains(c.pid)) {
      c.registered = true;
      c.registered_s = now;
      spdlog::info("autoscale: teacher pid {} registered after {:.1f} s", c.pid, now - c.started_s);
    } else if (now - c.started_s > kRegisterWithinS) {
      if (!c.overdue) {
        c.overdue = true;
        spdlog::warn(
            "autoscale: teacher pid {} has not registered (with its pid) within {} s; not waiting for it",
            c.pid, kRegisterWithinS);
      }
    } else {
      pending = true;
    }
  }
  const bool cooling = pending || now - last_change_s_ < opt_.cooldown_s;
  // Did the last teacher started next to others make the students faster? Judged once it has been
  // registered for the cooldown (at least kProbeSettleS: the students report one-second windows), by
  // the same students (others coming or going change the demand for other reasons: no judgement).
  const auto probed = std::find_if(children_.begin(), children_.end(), [&](const Child& c) {
    return probe_ && c.pid == probe_->pid && !c.stopping;
  });
  if (probe_ && (probed == children_.end() || o.students != probe_->students)) probe_.reset();
  if (probe_ && probed->registered &&
      now - probed->registered_s >= std::max(opt_.cooldown_s, kProbeSettleS)) {
    const double gain = o.demand - probe_->demand_before;
    const double per_teacher = probe_->demand_before / probe_->teachers_before;
    const int before = probe_->teachers_before;
    probe_.reset();
    if (gain < kMinGain * per_teacher) {
      ceiling_ = before;
      ceiling_until_s_ = now + kCeilingHoldS;
      const auto reason = fmt::format(
          "the last teacher made the students {:.0f} samples/s faster (from {:.0f}), less than half of the "
          "{:.0f} "
          "a teacher gave them: the teachers share their cores or host; at most {} teachers for {:.0f} s",
          gain, o.demand - gain, per_teacher, before, kCeilingHoldS);
      event(now, "observe", o, reason);
      stop_teacher(now, o, reason);
      return;
    }
  }
  AutoscaleOptions limited = opt_;
  if (now < ceiling_until_s_)
    limited.max_teachers = std::max(limited.min_teachers, std::min(opt_.max_teachers, ceiling_));
  auto d = decide(o, running(), cooling, limited);
  if (d.action == Action::kStart && probe_ && running() >= opt_.min_teachers) {
    d = {Action::kNone, fmt::format("{}; but the last teacher's gain is not judged yet", d.reason)};
  }
  if (d.action == Action::kStart && now - last_unexpected_exit_s_ < opt_.cooldown_s) {
    // A teacher that dies at once would otherwise be restarted every interval.
    d = {Action::kNone,
         fmt::format("{}; but a teacher exited {:.1f} s ago: not restarted within the cooldown", d.reason,
                     now - last_unexpected_exit_s_)};
  }
  event(now, "observe", o, d.reason);
  if (d.action == Action::kStart) start_teacher(now, o, d.reason);
  if (d.action == Action::kStop) stop_teacher(now, o, d.reason);
}

void Autoscaler::start_teacher(double now, const Observation& o, const std::string& reason) {
  int slot = 0;
  if (!opt_.cpus.empty()) {
    // A stopped teacher keeps its slot until it has exited: two never run on the same cpus.
    std::set<int> used;
    for (const auto& c : children_) used.insert(c.slot);
    while (used.contains(slot)) ++slot;
    if (static_cast<std::size_t>(slot) >= opt_.cpus.size()) {
      spdlog::info(
          "autoscale: would start a teacher ({}), but every cpus slot is taken (one is still exiting)",
          reason);
      return;
    }
  }
  std::vector<std::string> args;
  if (!opt_.cpus.empty()) args = {"taskset", "-c", opt_.cpus[static_cast<std::size_t>(slot)]};
  args.insert(args.end(), opt_.teacher_command.begin(), opt_.teacher_command.end());
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  // posix_spawn, not fork: glibc spawns with vfork semantics, which costs the same whatever this process's
  // size. The child gets default signal handling and an empty mask: a caller that blocks SIGTERM in every
  // thread (to sigwait for it) would otherwise hand teachers that SIGTERM cannot stop.
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t files;
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_init(&files);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (const int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2, SIGCHLD})
    sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
  // Registry and gRPC sockets without close-on-exec would stay open for the teacher's whole life.
  posix_spawn_file_actions_addclosefrom_np(&files, 3);
#endif
  pid_t pid = 0;
  // Counted before the teacher exists: once spawned it may register (and be seen in the registry) before
  // this thread runs again, and running() must not lag behind the registry. Undone if the spawn fails.
  running_.fetch_add(1);
  const int rc = ::posix_spawnp(&pid, argv.front(), &files, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attr);
  last_change_s_ = now;
  const std::string cpu = opt_.cpus.empty() ? std::string() : opt_.cpus[static_cast<std::size_t>(slot)];
  if (rc != 0) {
    running_.fetch_sub(1);
    last_unexpected_exit_s_ = now;
    spdlog::error("autoscale: cannot start the teacher command {}: {}", fmt::join(args, " "), errno_text(rc));
    event(now, "exited", o, fmt::format("posix_spawn: {}", errno_text(rc)), 0, cpu);
    return;
  }
  Child c;
  c.pid = pid;
  c.slot = slot;
  c.started_s = now;
  children_.push_back(c);
  if (o.teachers > 0 && o.students > 0 && o.demand > 0) {
    probe_ = Probe{pid, o.demand, o.students, o.teachers};
  } else {
    probe_.reset();
  }
  spdlog::info("autoscale: started teacher pid {}{} ({} running): {}", pid,
               cpu.empty() ? "" : " on cpus " + cpu, running(), reason);
  event(now, "start", o, reason, pid, cpu);
}

void Autoscaler::stop_teacher(double now, const Observation& o, const std::string& reason) {
  // The most recently started: the others have the longest-measured rates the decision was based on.
  Child* last = nullptr;
  for (auto& c : children_) {
    if (!c.stopping && (last == nullptr || c.started_s >= last->started_s)) last = &c;
  }
  if (last == nullptr) return;
  // Counted as stopped before the signal: the teacher may leave the registry before this thread runs again.
  last->stopping = true;
  last->stop_sent_s = now;
  last_change_s_ = now;
  running_.fetch_sub(1);
  // SIGTERM: the teacher revokes its lease on the way out, so the students drop it at once.
  ::kill(last->pid, SIGTERM);
  const std::string cpu = opt_.cpus.empty() ? std::string() : opt_.cpus[static_cast<std::size_t>(last->slot)];
  spdlog::info("autoscale: stopping teacher pid {} ({} running): {}", last->pid, running(), reason);
  event(now, "stop", o, reason, last->pid, cpu);
}

void Autoscaler::reap(double now) {
  for (auto it = children_.begin(); it != children_.end();) {
    int status = 0;
    const pid_t got = ::waitpid(it->pid, &status, WNOHANG);
    // ECHILD: already reaped elsewhere (SIGCHLD ignored by the host program): gone all the same.
    const bool gone = got == it->pid || (got < 0 && errno == ECHILD);
    if (!gone) {
      if (it->stopping && !it->killed && now - it->stop_sent_s > kTermGraceS) {
        spdlog::warn("autoscale: teacher pid {} did not exit {} s after SIGTERM: SIGKILL", it->pid,
                     kTermGraceS);
        ::kill(it->pid, SIGKILL);
        it->killed = true;
      }
      ++it;
      continue;
    }
    const std::string how = got == it->pid ? describe_status(status) : "reaped elsewhere";
    const std::string cpu = opt_.cpus.empty() ? std::string() : opt_.cpus[static_cast<std::size_t>(it->slot)];
    if (it->stopping) {
      spdlog::info("autoscale: teacher pid {} exited after the stop ({})", it->pid, how);
      event(now, "exited", last_, "stopped: " + how, it->pid, cpu);
    } else {
      // Not asked to: it died (crash, out of memory, killed by someone). The policy sees one fewer running
      // and starts another if still needed, after the cooldown.
      running_.fetch_sub(1);
      last_unexpected_exit_s_ = now;
      spdlog::warn("autoscale: teacher pid {} died ({}), {:.1f} s after its start", it->pid, how,
                   now - it->started_s);
      event(now, "exited", last_, "died: " + how, it->pid, cpu);
    }
    it = children_.erase(it);
  }
}

void Autoscaler::stop_all() {
  if (children_.empty()) return;
  const double now = now_s();
  for (auto& c : children_) {
    if (c.stopping) continue;
    c.stopping = true;  // counted before the signal, as in stop_teacher()
    c.stop_sent_s = now;
    running_.fetch_sub(1);
    ::kill(c.pid, SIGTERM);
    event(now, "stop", last_, "the autoscaler exits", c.pid,
          opt_.cpus.empty() ? std::string() : opt_.cpus[static_cast<std::size_t>(c.slot)]);
  }
  // Every teacher gets the whole grace from now (also one stopped earlier: it was at most that close).
  for (auto& c : children_) c.stop_sent_s = now;
  while (!children_.empty() && now_s() - now <= kTermGraceS) {
    reap(now_s());
    if (!children_.empty()) std::this_thread::sleep_for(20ms);
  }
  for (auto& c : children_) {
    spdlog::warn("autoscale: teacher pid {} did not exit {} s after SIGTERM: SIGKILL", c.pid, kTermGraceS);
    ::kill(c.pid, SIGKILL);
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    event(now_s(), "exited", last_, "killed after the grace", c.pid,
          opt_.cpus.empty() ? std::string() : opt_.cpus[static_cast<std::size_t>(c.slot)]);
  }
  children_.clear();
}

void Autoscaler::event(double now, const char* name, const Observation& o, const std::string& reason, int pid,
                       const std::string& cpu, bool failed) {
  if (events_ == nullptr) return;
  nlohmann::json j{{"t", std::round(now * 1000) / 1000},
                   {"event", name},
                   {"students", o.students},
                   {"teachers", o.teachers},
                   {"running", running()},
                   {"wait_fraction", o.wait_fraction},
                   {"missing_fraction", o.missing_fraction},
                   {"demand", o.demand},
                   {"capacity", o.capacity},
                   {"reason", reason}};
  if (pid != 0) j["pid"] = pid;
  if (!cpu.empty()) j["cpu"] = cpu;
  if (failed) j["error"] = true;  // an observation that failed: its numbers are not the registry's
  // Flushed per line: a plot of a run still going, or of one that was killed, sees every event.
  std::fprintf(events_, "%s\n", j.dump().c_str());
  std::fflush(events_);
}

}  // namespace sinew::serve
