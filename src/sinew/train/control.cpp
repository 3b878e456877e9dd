#include "sinew/train/control.hpp"

#include <atomic>
#include <csignal>

namespace sinew::train {

namespace {
/// Set by SIGUSR1/SIGTERM: checkpoint within kControlEvery steps, then stop (exit code 75).
std::atomic<int> g_stop_signal{0};
/// Set by SIGUSR2: this rank leaves the group at the next control point (not a failure).
std::atomic<int> g_leave_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }
extern "C" void on_leave_signal(int sig) { g_leave_signal.store(sig); }

/// catch_early() ran and no Signals took its handlers over yet; the handlers it replaced.
bool g_early = false;
struct Handlers {
  void (*usr1)(int) = nullptr;
  void (*term)(int) = nullptr;
  void (*usr2)(int) = nullptr;
};
Handlers g_before_early;
bool g_ever_early = false;
}  // namespace

void Signals::catch_early() {
  if (g_ever_early) return;
  g_ever_early = true;
  g_early = true;
  g_stop_signal.store(0);
  g_leave_signal.store(0);
  g_before_early.usr1 = std::signal(SIGUSR1, on_stop_signal);
  g_before_early.term = std::signal(SIGTERM, on_stop_signal);
  g_before_early.usr2 = std::signal(SIGUSR2, on_leave_signal);
}

Signals::Signals() {
  if (g_early) {
    // The handlers have been ours since the start of main(), the flags hold what arrived since. They are
    // installed once more in case a library (MPI_Init) replaced them meanwhile.
    g_early = false;
    old_usr1_ = g_before_early.usr1;
    old_term_ = g_before_early.term;
    old_usr2_ = g_before_early.usr2;
    std::signal(SIGUSR1, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGUSR2, on_leave_signal);
    return;
  }
  g_stop_signal.store(0);
  g_leave_signal.store(0);
  old_usr1_ = std::signal(SIGUSR1, on_stop_signal);
  old_term_ = std::signal(SIGTERM, on_stop_signal);
  old_usr2_ = std::signal(SIGUSR2, on_leave_signal);
}

Signals::~Signals() {
  std::signal(SIGUSR1, old_usr1_);
  std::signal(SIGTERM, old_term_);
  std::signal(SIGUSR2, old_usr2_);
}

int Signals::stop() noexcept { return g_stop_signal.load(); }
bool Signals::leave() noexcept { return g_leave_signal.load() != 0; }

StepControl::StepControl(std::vector<std::pair<std::int64_t, int>> schedule, int max_ranks,
                         std::int64_t checkpoint_every)
    : schedule_(std::move(schedule)), max_ranks_(max_ranks), checkpoint_every_(checkpoint_every) {}

int StepControl::target_size(const Position& p) const {
  int t = max_ranks_ > 0 ? max_ranks_ : static_cast<int>(p.launch_world);
  if (p.target_override > 0) t = static_cast<int>(p.target_override);
  for (const auto& [at, size] : schedule_)
    if (p.step >= at) t = size;
  return t;
}

Decision StepControl::agree(const Position& p, comm::Backend& backend, const comm::Options& op,
                            bool checkpointing, bool async_in_flight, bool async_ready) const {
  const int rank = backend.rank(), world = backend.size();
  Decision d;
  d.checkpoint_due = checkpointing && checkpoint_every_ > 0 && p.step % checkpoint_every_ == 0;
  d.resize_due = has_schedule() && target_size(p) != world;
  if (p.step % kControlEvery != 0 && !d.checkpoint_due && !d.resize_due) return d;
  std::vector<std::int64_t> v(2 + static_cast<std::size_t>(world), 0);
  v[0] = Signals::stop();
  v[1] = async_in_flight && !async_ready ? 1 : 0;
  v[2 + static_cast<std::size_t>(rank)] = Signals::leave() ? 1 : 0;
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(v)), comm::ReduceOp::kMax, op);
  d.agreed = true;
  d.stop_signal = static_cast<int>(v[0]);
  d.async_pending = v[1] != 0;
  d.leaving.assign(static_cast<std::size_t>(world), false);
  for (int r = 0; r < world; ++r) {
    d.leaving[static_cast<std::size_t>(r)] = v[2 + static_cast<std::size_t>(r)] != 0;
    d.asked += d.leaving[static_cast<std::size_t>(r)] ? 1 : 0;
  }
  return d;
}

}  // namespace sinew::train
