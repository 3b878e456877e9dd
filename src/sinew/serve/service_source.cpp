#include "sinew/serve/service_source.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/distill/balancer.hpp"
#include "sinew/serve/etcd.hpp"
#include "sinew/serve/teacher_client.hpp"

namespace sinew::serve {

std::string teachers_prefix(const std::string& job) { return "/sinew/" + job + "/teachers/"; }
std::string students_prefix(const std::string& job) { return "/sinew/" + job + "/students/"; }

namespace {

using distill::Clock;
using namespace std::chrono_literals;

/// A teacher failed a request: others get its requests for this long (unless the registry drops it first).
constexpr auto kSuspectFor = 3s;
/// The student's registration lease: the autoscaler forgets a student this long after it is gone.
constexpr int kStudentTtlS = 5;

struct Teacher {
  std::string key, address, model;
  double samples_per_s = 0;
  std::shared_ptr<TeacherClient> client;
  Clock::time_point suspect_until{};
};

class ServiceSource final : public distill::LogitSource {
 public:
  explicit ServiceSource(const distill::ServiceSpec& spec) : spec_(spec), etcd_(spec.registry) {
    if (!etcd_.healthy()) {
      SINEW_THROW(ServiceError,
                  "the teacher registry at {} does not answer: start etcd there (hpc/etcd/etcd.sh up) or "
                  "give the right "
                  "--distill-registry",
                  spec.registry);
    }
    registration_ =
        std::make_unique<Registration>(spec.registry, students_prefix(spec.job) + spec.student,
                                       nlohmann::json{{"student", spec.student}}.dump(), kStudentTtlS);
    watch_ = std::make_unique<PrefixWatch>(spec.registry, teachers_prefix(spec.job),
                                           [this](const std::vector<KeyValue>& kvs) { update(kvs); });
    // Teachers already registered are usually listed within milliseconds; a student may also start first.
    const auto until = Clock::now() + 2s;
    while (Clock::now() < until) {
      {
        const std::lock_guard lock(mu_);
        if (!teachers_.empty()) break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }

  ServiceSource(const ServiceSource&) = delete;
  ServiceSource& operator=(const ServiceSource&) = delete;
  ServiceSource(ServiceSource&&) = delete;
  ServiceSource& operator=(ServiceSource&&) = delete;
  ~ServiceSource() override {
    watch_.reset();  // no more updates into a half-destroyed object
    registration_.reset();
  }

  void fetch(std::span<const std::size_t> indices, Clock::time_point deadline,
             std::vector<float>& out) override {
    std::string last_error = "no teacher is registered for job '" + spec_.job + "'";
    std::set<std::string> tried;
    for (;;) {
      const auto now = Clock::now();
      if (now >= deadline) break;
      std::shared_ptr<TeacherClient> client;
      std::string key;
      std::size_t untried = 0;
      {
        const std::lock_guard lock(mu_);
        rebalance_if_needed();
        // The balancer's pick first; if it failed recently or was tried for this request, any other healthy
        // teacher; at last a suspect one (it may be back).
        auto usable = [&](const Teacher& t, bool allow_suspect) {
          return !tried.contains(t.key) && (allow_suspect || t.suspect_until <= now);
        };
        if (!rr_.shares().empty()) {
          const auto pick = order_[rr_.next()];
          if (usable(teachers_.at(pick), false)) key = pick;
        }
        for (const bool suspect : {false, true}) {
          if (!key.empty()) break;
          for (const auto& [k, t] : teachers_) {
            if (usable(t, suspect)) {
              key = k;
              break;
            }
          }
        }
        for (const auto& [k, t] : teachers_) untried += usable(t, true) ? 1 : 0;
        if (!key.empty()) client = teachers_.at(key).client;
      }
      if (!client) break;
      tried.insert(key);
      // Leave time for another teacher when there is one: a hung teacher costs half the time left.
      const auto attempt = untried > 1 ? now + (deadline - now) / 2 : deadline;
      try {
        int classes = 0;
        client->infer(indices, spec_.dataset, attempt, out, classes);
        if (classes != spec_.classes) {
          SINEW_THROW(ServiceError, "teacher {} answered {} classes, the data set has {}", client->address(),
                      classes, spec_.classes);
        }
        if (tried.size() > 1) ++failovers_;
        return;
      } catch (const ServiceError& e) {
        last_error = e.message();
        const std::lock_guard lock(mu_);
        if (auto it = teachers_.find(key); it != teachers_.end())
          it->second.suspect_until = Clock::now() + kSuspectFor;
      }
    }
    SINEW_THROW(ServiceError, "no teacher answered within the deadline ({} tried): {}", tried.size(),
                last_error);
  }

  [[nodiscard]] int classes() const override { return spec_.classes; }
  [[nodiscard]] std::int64_t failovers() const override { return failovers_; }

  void report(const distill::StudentReport& r) override {
    registration_->update(nlohmann::json{
        {"student", spec_.student},
        {"wait_ms_per_step", r.wait_ms_per_step},
        {"step_ms", r.step_ms},
        {"samples_per_s", r.samples_per_s},
        {"missing_fraction",
         r.missing_fraction}}.dump());
  }

  [[nodiscard]] std::string describe() const override {
    const std::lock_guard lock(mu_);
    return fmt::format("the teacher service of job '{}' at {} ({} teachers now)", spec_.job, spec_.registry,
                       teachers_.size());
  }

 private:
  /// The registry changed: the current teachers (a new one gets a client, a gone one is dropped).
  void update(const std::vector<KeyValue>& kvs) {
    const std::lock_guard lock(mu_);
    std::map<std::string, Teacher> next;
    for (const auto& kv : kvs) {
      Teacher t;
      t.key = kv.key;
      try {
        const auto j = nlohmann::json::parse(kv.value);
        t.address = j.at("address").get<std::string>();
        t.model = j.value("model", "");
        t.samples_per_s = j.value("samples_per_s", 0.0);
        const std::string dataset = j.value("dataset", "");
        if (dataset != spec_.dataset) {
          if (warned_.insert(kv.key).second) {
            spdlog::warn("teacher {} serves other data ({}) than this student's ({}): not used", kv.key,
                         dataset, spec_.dataset);
          }
          continue;
        }
      } catch (const nlohmann::json::exception& e) {
        if (warned_.insert(kv.key).second)
          spdlog::warn("teacher entry {} is unreadable: {}", kv.key, e.what());
        continue;
      }
      if (auto it = teachers_.find(kv.key); it != teachers_.end() && it->second.address == t.address) {
        t.client = it->second.client;
        t.suspect_until = it->second.suspect_until;
      } else {
        t.client = std::make_shared<TeacherClient>(t.address, spec_.token);
        spdlog::info("teacher {} ({}) at {} joined", kv.key.substr(teachers_prefix(spec_.job).size()),
                     t.model, t.address);
      }
      next.emplace(kv.key, std::move(t));
    }
    for (const auto& [k, t] : teachers_) {
      if (!next.contains(k))
        spdlog::info("teacher {} at {} left", k.substr(teachers_prefix(spec_.job).size()), t.address);
    }
    teachers_ = std::move(next);
    stale_ = true;
  }

  /// The shares of this student (balancer.hpp) for the current teachers and the student's place in its
  /// group; recomputed when either changed. With mu_ held.
  void rebalance_if_needed() {
    const auto [rank, size] = spec_.position ? spec_.position() : std::pair{0, 1};
    if (!stale_ && rank == rank_ && size == size_) return;
    rank_ = rank;
    size_ = size;
    stale_ = false;
    order_.clear();
    std::vector<double> caps;
    for (const auto& [k, t] : teachers_) {  // std::map: every student sees the same order
      order_.push_back(k);
      caps.push_back(t.samples_per_s);
    }
    rr_ = caps.empty() || size <= 0 || rank < 0 || rank >= size
              ? distill::RoundRobin()
              : distill::RoundRobin(
                    distill::assign(caps, static_cast<std::size_t>(size), static_cast<std::size_t>(rank)));
  }

  distill::ServiceSpec spec_;
  Etcd etcd_;
  mutable std::mutex mu_;
  std::map<std::string, Teacher> teachers_;
  std::set<std::string> warned_;
  bool stale_ = true;
  int rank_ = -1, size_ = 0;
  std::vector<std::string> order_;
  distill::RoundRobin rr_;
  std::atomic<std::int64_t> failovers_{0};
  std::unique_ptr<Registration> registration_;
  std::unique_ptr<PrefixWatch> watch_;
};

}  // namespace

std::unique_ptr<distill::LogitSource> service_source(const distill::ServiceSpec& spec) {
  return std::make_unique<ServiceSource>(spec);
}

}  // namespace sinew::serve
