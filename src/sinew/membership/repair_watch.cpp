#include "sinew/membership/repair_watch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/core/status.hpp"

namespace sinew::membership {

std::chrono::milliseconds repair_deadline(int processes, std::chrono::milliseconds detect) {
  using std::chrono::milliseconds;
  return std::max(detect, milliseconds(0)) + milliseconds(5000) + milliseconds(10) * std::max(processes, 1);
}

struct RepairWatch::Impl {
  struct Armed {
    std::string what;
    std::chrono::milliseconds deadline{0};
    std::chrono::steady_clock::time_point due;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, Armed> armed;
  std::uint64_t next_id = 1;
  Expired expired;
  bool started = false;

  /// The watching thread: sleeps until the earliest deadline (or a change), acts on the passed ones.
  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      if (armed.empty()) {
        cv.wait(lock);
        continue;
      }
      const auto first = std::min_element(armed.begin(), armed.end(), [](const auto& a, const auto& b) {
        return a.second.due < b.second.due;
      });
      if (const auto due = first->second.due; std::chrono::steady_clock::now() < due) {
        cv.wait_until(lock, due);  // a copy: the entry may be disarmed (freed) while this waits
        continue;
      }
      Armed a = std::move(first->second);
      armed.erase(first);
      Expired f = expired;
      lock.unlock();
      if (f) {
        f(a.what, a.deadline);
      } else {
        RepairWatch::leave_for_relaunch(a.what, a.deadline);
      }
      lock.lock();
    }
  }
};

RepairWatch& RepairWatch::process() {
  // Never destroyed: its thread may act while the process exits (static destructors run) or is stuck.
  static auto* w = new RepairWatch();  // NOLINT(cppcoreguidelines-owning-memory)
  return *w;
}

RepairWatch::Impl& RepairWatch::impl() {
  static auto* i = new Impl();  // NOLINT(cppcoreguidelines-owning-memory): as process()
  return *i;
}

RepairWatch::Guard RepairWatch::arm(std::string what, std::chrono::milliseconds deadline) {
  Impl& m = impl();
  std::uint64_t id = 0;
  {
    std::lock_guard lock(m.mu);
    if (!m.started) {
      std::thread([&m] { m.run(); }).detach();
      m.started = true;
    }
    id = m.next_id++;
    m.armed.emplace(id, Impl::Armed{std::move(what), deadline, std::chrono::steady_clock::now() + deadline});
  }
  m.cv.notify_all();
  return Guard(this, id);
}

void RepairWatch::disarm(std::uint64_t id) noexcept {
  Impl& m = impl();
  {
    std::lock_guard lock(m.mu);
    m.armed.erase(id);
  }
  m.cv.notify_all();
}

void RepairWatch::on_expired(Expired f) {
  Impl& m = impl();
  std::lock_guard lock(m.mu);
  m.expired = std::move(f);
}

void RepairWatch::leave_for_relaunch(const std::string& what, std::chrono::milliseconds deadline) {
  // The launcher (mpi_scripts/sinew-run) counts the processes that leave this way by their status
  // records (core/status.hpp), as those of the restart mode; the line is for people, one write of it
  // (stderr is unbuffered).
  const std::string stuck =
      fmt::format("{} did not return within {:.1f} s", what, static_cast<double>(deadline.count()) / 1e3);
  status::process().relaunch(status::Reason::kRepairDeadline, stuck);
  const std::string line = fmt::format(
      "[sinew] {}: stuck inside the MPI library; leaving without MPI_Finalize, exiting for a relaunch from "
      "the latest checkpoint (exit code {})\n",
      stuck, static_cast<int>(ExitCode::kRelaunch));
  std::fputs(line.c_str(), stderr);
  std::fflush(nullptr);
  std::_Exit(static_cast<int>(ExitCode::kRelaunch));
}

void RepairWatch::leave_when_orphaned() {
  static std::once_flag once;
  std::call_once(once, [] {
    const pid_t parent = ::getppid();
    if (parent <= 1) return;  // started by init, or already orphaned: nothing to watch
    std::thread([parent] {
      while (::getppid() == parent) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      status::process().relaunch(status::Reason::kLauncherGone,
                                 fmt::format("the launcher's process (pid {}) is gone", parent));
      const std::string line = fmt::format(
          "[sinew] the launcher's process on this node (pid {}) is gone: leaving without MPI_Finalize, "
          "exiting "
          "for a relaunch from the latest checkpoint (exit code {})\n",
          parent, static_cast<int>(ExitCode::kRelaunch));
      std::fputs(line.c_str(), stderr);
      std::fflush(nullptr);
      std::_Exit(static_cast<int>(ExitCode::kRelaunch));
    }).detach();
  });
}

RepairWatch::Guard& RepairWatch::Guard::operator=(Guard&& o) noexcept {
  if (this != &o) {
    release();
    watch_ = std::exchange(o.watch_, nullptr);
    id_ = o.id_;
  }
  return *this;
}

void RepairWatch::Guard::release() noexcept {
  if (watch_ != nullptr) std::exchange(watch_, nullptr)->disarm(id_);
}

}  // namespace sinew::membership
