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

struct Handlers {
  void (*usr1)(int) = nullptr;
  void (*term)(int) = nullptr;
  void (*usr2)(int) = nullptr;
};

/// Installs `h`; returns the handlers it replaced.
Handlers install(const Handlers& h) {
  return {std::signal(SIGUSR1, h.usr1), std::signal(SIGTERM, h.term), std::signal(SIGUSR2, h.usr2)};
}
const Handlers kOurs{on_stop_signal, on_stop_signal, on_leave_signal};

/// catch_early() ran and no Signals took its handlers over yet; the handlers it replaced.
bool g_early = false;
Handlers g_before_early;
bool g_ever_early = false;
}  // namespace

void Signals::catch_early() {
  if (g_ever_early) return;
  g_ever_early = true;
  g_early = true;
  g_stop_signal.store(0);
  g_leave_signal.store(0);
  g_before_early = install(kOurs);
}

Signals::Signals() {
  // After catch_early() the handlers have been ours since the start of main() and the flags hold what
  // arrived since; they are installed once more in case a library (MPI_Init) replaced them meanwhile.
  if (!g_early) {
    g_stop_signal.store(0);
    g_leave_signal.store(0);
  }
  const Handlers replaced = install(kOurs);
  const Handlers& old = g_early ? g_before_early : replaced;
  old_usr1_ = old.usr1;
  old_term_ = old.term;
  old_usr2_ = old.usr2;
  g_early = false;
}

Signals::~Signals() { install({old_usr1_, old_term_, old_usr2_}); }

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
