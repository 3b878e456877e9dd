// The teachers' autoscaler: its policy (decide(), pure), its options, and one real run against a private
// etcd (SINEW_ETCD, from with_etcd.sh) with stand-in teacher processes (autoscale_fake_teacher.sh) that
// register themselves, while the test plays the students by putting their reports.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/serve/autoscaler.hpp"
#include "sinew/serve/etcd.hpp"
#include "sinew/serve/service_source.hpp"

namespace sinew::serve {
namespace {

using namespace std::chrono_literals;

AutoscaleOptions options(int min = 1, int max = 4) {
  AutoscaleOptions o;
  o.registry = "http://127.0.0.1:1";
  o.job = "test";
  o.teacher_command = {"true"};
  o.min_teachers = min;
  o.max_teachers = max;
  o.target_wait_fraction = 0.05;
  return o;
}

Observation observed(double wait, int teachers, double per_teacher, double demand) {
  Observation o;
  o.students = 4;
  o.wait_fraction = wait;
  o.teachers = teachers;
  o.capacity = teachers * per_teacher;
  o.min_teacher_capacity = teachers > 0 ? per_teacher : 0;
  o.demand = demand;
  return o;
}

TEST(AutoscaleDecide, StartsWhenStudentsWaitTooLong) {
  const auto d = decide(observed(0.20, 1, 100, 90), 1, false, options());
  EXPECT_EQ(d.action, Action::kStart) << d.reason;
  EXPECT_NE(d.reason.find("20.0%"), std::string::npos) << d.reason;
}

TEST(AutoscaleDecide, StartsWhenStudentsMissLogits) {
  // No teacher at all: students' requests fail at once, so they wait little but miss every logit.
  auto o = observed(0.0, 0, 0, 0);
  o.missing_fraction = 1.0;
  EXPECT_EQ(decide(o, 0, false, options(0, 2)).action, Action::kStart);
}

TEST(AutoscaleDecide, NotWhileCoolingDown) {
  const auto d = decide(observed(0.50, 1, 100, 90), 1, true, options());
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_NE(d.reason.find("cooling"), std::string::npos) << d.reason;
  EXPECT_EQ(decide(observed(0.0, 3, 100, 10), 3, true, options()).action, Action::kNone);
}

TEST(AutoscaleDecide, NotAboveTheMaximum) {
  const auto d = decide(observed(0.50, 4, 100, 900), 4, false, options(1, 4));
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_NE(d.reason.find("maximum"), std::string::npos) << d.reason;
  EXPECT_EQ(decide(observed(0.50, 3, 100, 900), 3, false, options(1, 4)).action, Action::kStart);
}

TEST(AutoscaleDecide, StopsOnlyWithSpareCapacity) {
  // 3 x 100 samples/s. Without one, 200 are left: enough for a demand of 150 (x1.25 = 187.5), not for 170.
  EXPECT_EQ(decide(observed(0.0, 3, 100, 150), 3, false, options()).action, Action::kStop);
  const auto d = decide(observed(0.0, 3, 100, 170), 3, false, options());
  EXPECT_EQ(d.action, Action::kNone);
  EXPECT_NE(d.reason.find("would be left"), std::string::npos) << d.reason;
  // Unequal teachers: the smallest is the one assumed gone (250 + 50: 250 left covers 190).
  auto o = observed(0.0, 2, 0, 190);
  o.capacity = 300;
  o.min_teacher_capacity = 50;
  EXPECT_EQ(decide(o, 2, false, options()).action, Action::kStop);
  // Not while the students still wait more than a quarter of the target, however large the capacity.
  EXPECT_EQ(decide(observed(0.02, 3, 1000, 10), 3, false, options()).action, Action::kNone);
}

TEST(AutoscaleDecide, KeepsTheMinimum) {
  // Below the minimum (none started yet, or one died): start, even while cooling down, even with no students.
  EXPECT_EQ(decide(Observation{}, 0, false, options(1, 4)).action, Action::kStart);
  EXPECT_EQ(decide(Observation{}, 1, true, options(2, 4)).action, Action::kStart);
  // At the minimum: no stop, however idle.
  EXPECT_EQ(decide(observed(0.0, 2, 1000, 0), 2, false, options(2, 4)).action, Action::kNone);
  // No students at all: down to the minimum.
  EXPECT_EQ(decide(Observation{}, 3, false, options(2, 4)).action, Action::kStop);
}

TEST(AutoscaleDecide, NoFlappingAroundTheTarget) {
  const auto opt = options(1, 8);
  // Anywhere between target / 4 and the target: nothing changes, whatever the capacity.
  for (const double wait : {0.0125, 0.02, 0.035, 0.049, 0.05}) {
    EXPECT_EQ(decide(observed(wait, 3, 1000, 10), 3, false, opt).action, Action::kNone) << wait;
  }
  // A closed loop: students that want 250 samples/s from teachers of 100 each wait for the missing part.
  // It settles at 3 teachers after 2 starts and stays there (with 2, they wait; without a third the
  // other two do not cover 1.25 x the demand, so it is never stopped).
  int teachers = 1, changes = 0;
  double last_change = -1e9;
  for (int tick = 0; tick < 200; ++tick) {
    const double capacity = 100.0 * teachers;
    const double wait = std::max(0.0, 1.0 - capacity / 250.0);
    const auto o = observed(wait, teachers, 100, std::min(250.0, capacity));
    const auto d = decide(o, teachers, tick - last_change < 4, opt);
    if (d.action == Action::kNone) continue;
    teachers += d.action == Action::kStart ? 1 : -1;
    ++changes;
    last_change = tick;
  }
  EXPECT_EQ(teachers, 3);
  EXPECT_EQ(changes, 2);
}

TEST(AutoscaleOptions, InvalidOptionsAreNamed) {
  const auto rejects = [](const std::function<void(AutoscaleOptions&)>& change, const std::string& name) {
    auto o = options();
    change(o);
    try {
      Autoscaler a(o);
      ADD_FAILURE() << "accepted; expected an error naming " << name;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find(name), std::string::npos) << e.message();
    }
  };
  rejects([](auto& o) { o.registry.clear(); }, "--registry");
  rejects([](auto& o) { o.job = "a/b"; }, "--job");
  rejects([](auto& o) { o.teacher_command.clear(); }, "teacher command");
  rejects([](auto& o) { o.teacher_command = {"/nonexistent/sinew-teacher"}; }, "teacher command");
  rejects([](auto& o) { o.min_teachers = 5; }, "--min-teachers");
  rejects([](auto& o) { o.max_teachers = 0; }, "--max-teachers");
  rejects([](auto& o) { o.cpus = {"0", "1"}; }, "--max-teachers");  // 4 teachers, 2 slots
  rejects([](auto& o) { o.cpus = {"0", "x", "2", "3"}; }, "--cpus");
  rejects([](auto& o) { o.target_wait_fraction = 0; }, "--target-wait");
  rejects([](auto& o) { o.interval_s = 0; }, "--interval");
  rejects([](auto& o) { o.cooldown_s = -1; }, "--cooldown");
  rejects([](auto& o) { o.duration_s = -1; }, "--duration");
  rejects([](auto& o) { o.events = "/nonexistent/dir/events.jsonl"; }, "--events");
  EXPECT_NO_THROW(Autoscaler a(options()));
}

TEST(AutoscaleRun, RegistryThatDoesNotAnswerIsAServiceError) {
  Autoscaler a(options());  // http://127.0.0.1:1: refused at once
  EXPECT_THROW(a.run(), ServiceError);
  EXPECT_EQ(a.running(), 0);
}

/// The first `n` cpus this process may run on, as taskset lists; empty if it has fewer.
std::vector<std::string> own_cpus(std::size_t n) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<std::string> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE && out.size() < n; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(std::to_string(c));
  }
  if (out.size() < n) out.clear();
  return out;
}

std::vector<nlohmann::json> read_events(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

/// Polls `done` every 50 ms for at most `limit`; whether it became true.
bool within(std::chrono::milliseconds limit, const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

TEST(AutoscaleEtcd, StartsAndStopsRealTeachers) {
  const char* endpoint = std::getenv("SINEW_ETCD");  // NOLINT(concurrency-mt-unsafe)
  if (endpoint == nullptr || *endpoint == '\0')
    GTEST_SKIP() << "SINEW_ETCD is not set (run under with_etcd.sh)";
  const std::string job = "autoscale-test-" + std::to_string(::getpid());
  const auto events = (std::filesystem::temp_directory_path() / (job + ".jsonl")).string();
  Etcd etcd(endpoint);
  ASSERT_TRUE(etcd.healthy());

  AutoscaleOptions opt;
  opt.registry = endpoint;
  opt.job = job;
  const std::string fake_teacher = std::string(SINEW_SOURCE_DIR) + "/tests/serve/autoscale_fake_teacher.sh";
  opt.teacher_command = {"bash", fake_teacher, endpoint, job, "1000"};
  opt.cpus = own_cpus(2);  // pinned where there are two cpus: taskset in the path too
  opt.min_teachers = 1;
  opt.max_teachers = 2;
  opt.interval_s = 0.2;
  opt.cooldown_s = 1.0;
  opt.events = events;

  // Two students, each waiting half its step for logits, 300 samples/s together.
  const auto students = [&](double wait_ms) {
    for (const char* s : {"s0", "s1"}) {
      etcd.put(students_prefix(job) + s, nlohmann::json{{"student", s},
                                                        {"wait_ms_per_step", wait_ms},
                                                        {"step_ms", 100.0},
                                                        {"samples_per_s", 150.0},
                                                        {"missing_fraction", 0.0}}
                                             .dump());
    }
  };
  const auto registered = [&] { return etcd.list(teachers_prefix(job)).size(); };
  students(50);
  // Real students get faster with each teacher that has a core of its own: 150 samples/s per teacher.
  std::atomic<bool> waiting{true}, done{false};
  std::thread faster([&] {
    while (!done) {
      if (waiting) {
        const auto n = static_cast<double>(std::max<std::size_t>(1, registered()));
        for (const char* s : {"s0", "s1"}) {
          etcd.put(students_prefix(job) + s, nlohmann::json{{"student", s},
                                                            {"wait_ms_per_step", 50.0},
                                                            {"step_ms", 100.0},
                                                            {"samples_per_s", 75.0 * n},
                                                            {"missing_fraction", 0.0}}
                                                 .dump());
        }
      }
      std::this_thread::sleep_for(100ms);
    }
  });

  std::vector<int> pids;
  {
    Autoscaler scaler(opt);
    std::thread loop([&] { scaler.run(); });
    // The minimum at once, the second one when the first has registered and the cooldown passed.
    EXPECT_TRUE(within(20s, [&] { return scaler.running() == 2 && registered() == 2; }))
        << scaler.running() << " running, " << registered() << " registered";

    // Students stop waiting: 2000 samples/s for 300 is far more than needed; the second one goes, and
    // its key with it (the teacher revokes its lease on SIGTERM).
    waiting = false;
    done = true;
    faster.join();
    students(0);
    EXPECT_TRUE(within(20s, [&] { return scaler.running() == 1 && registered() == 1; }))
        << scaler.running() << " running, " << registered() << " registered";

    // The one left dies: it is reported and replaced (the minimum), after the cooldown.
    int first = 0;
    for (const auto& e : read_events(events)) {
      if (e["event"] == "start" && first == 0) first = e["pid"].get<int>();
    }
    ASSERT_GT(first, 0);
    ASSERT_EQ(::kill(first, SIGKILL), 0);
    EXPECT_TRUE(within(20s, [&] {
      int starts = 0;
      for (const auto& e : read_events(events)) starts += e["event"] == "start" ? 1 : 0;
      return starts == 3 && scaler.running() == 1;
    }));

    scaler.stop();
    loop.join();
    for (const auto& e : read_events(events)) {
      if (e["event"] == "start") pids.push_back(e["pid"].get<int>());
    }
  }
  // Destroyed: every teacher it started is gone (reaped, so the pids are free), and none is registered.
  ASSERT_EQ(pids.size(), 3U);
  for (const int pid : pids) {
    EXPECT_EQ(::kill(pid, 0), -1) << "teacher pid " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH);
  }
  // The killed one's lease takes its TTL (3 s) to expire; the others revoked theirs.
  EXPECT_TRUE(within(10s, [&] { return registered() == 0; })) << registered() << " still registered";

  const auto all = read_events(events);
  int observes = 0, exits = 0, died = 0;
  for (const auto& e : all) {
    observes += e["event"] == "observe" ? 1 : 0;
    exits += e["event"] == "exited" ? 1 : 0;
    if (e["event"] == "exited" && e["reason"].get<std::string>().starts_with("died")) ++died;
    if (e["event"] == "start" && !opt.cpus.empty()) {
      EXPECT_TRUE(e.contains("cpu")) << e.dump();
    }
  }
  EXPECT_GT(observes, 10);
  EXPECT_EQ(exits, 3);
  EXPECT_EQ(died, 1);
  etcd.erase(students_prefix(job) + "s0");
  etcd.erase(students_prefix(job) + "s1");
  std::filesystem::remove(events);
}

// Teachers that share one core (the stand-in publishes R / teachers registered): the second one adds
// nothing, so it is stopped again, and no second one is started while the hold lasts, although the
// students still wait.
TEST(AutoscaleEtcd, TakesBackATeacherThatAddsNoCapacity) {
  const char* env = std::getenv("SINEW_ETCD");  // NOLINT(concurrency-mt-unsafe)
  const std::string endpoint = env != nullptr ? env : "";
  if (endpoint.empty()) GTEST_SKIP() << "SINEW_ETCD is not set (run under with_etcd.sh)";
  const std::string job = "autoscale-shared-" + std::to_string(::getpid());
  const auto events = (std::filesystem::temp_directory_path() / (job + ".jsonl")).string();
  Etcd etcd(endpoint);
  AutoscaleOptions opt;
  opt.registry = endpoint;
  opt.job = job;
  opt.teacher_command = {"bash", std::string(SINEW_SOURCE_DIR) + "/tests/serve/autoscale_fake_teacher.sh",
                         endpoint, job, "shared:1000"};
  opt.min_teachers = 1;
  opt.max_teachers = 3;
  opt.interval_s = 0.2;
  opt.cooldown_s = 1.0;
  opt.events = events;
  etcd.put(students_prefix(job) + "s0", nlohmann::json{{"student", "s0"},
                                                       {"wait_ms_per_step", 50.0},
                                                       {"step_ms", 100.0},
                                                       {"samples_per_s", 900.0},
                                                       {"missing_fraction", 0.0}}
                                            .dump());
  {
    Autoscaler scaler(opt);
    std::thread loop([&] { scaler.run(); });
    const auto taken_back = [&] {
      for (const auto& e : read_events(events)) {
        if (e["event"] == "stop" &&
            e["reason"].get<std::string>().find("share their cores") != std::string::npos)
          return true;
      }
      return false;
    };
    EXPECT_TRUE(within(30s, taken_back)) << "the second teacher was not taken back";
    // The hold: students still wait, but no teacher is started again.
    std::this_thread::sleep_for(3s);
    int starts = 0;
    for (const auto& e : read_events(events)) starts += e["event"] == "start" ? 1 : 0;
    EXPECT_EQ(starts, 2);
    EXPECT_EQ(scaler.running(), 1);
    scaler.stop();
    loop.join();
  }
  etcd.erase(students_prefix(job) + "s0");
  std::filesystem::remove(events);
}

}  // namespace
}  // namespace sinew::serve
