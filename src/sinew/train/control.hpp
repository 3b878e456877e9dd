// Step boundaries: where the group agrees on what happens next.
//
// Every kControlEvery steps, at every periodic checkpoint and at every resize the job server asked for,
// one small collective (an allreduce of max over a few integers) agrees on
//   - a stop signal (SIGUSR1/SIGTERM), which may have reached only some ranks: checkpoint, then stop;
//   - leave requests (SIGUSR2): those ranks leave the group, the others continue;
//   - whether every rank finished its part of the background checkpoint's current stage;
// and, with the resize schedule (--resize-schedule, --max-ranks, leaves), the size the group should have.
// The result is a Decision; the trainer carries it out (checkpoint policy, elastic controller).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/train/replicated_state.hpp"

namespace sinew::train {

/// Steps between the agreements on stop signals, leave requests and finished background checkpoints.
inline constexpr std::int64_t kControlEvery = 10;

/// Installs the stop (SIGUSR1, SIGTERM) and leave (SIGUSR2) handlers while alive; restores the previous
/// ones after. One at a time per process (the handlers set process-wide flags). A new Signals starts with
/// no signal received, unless catch_early() ran before it: then it keeps what arrived since.
class Signals {
 public:
  Signals();
  Signals(const Signals&) = delete;
  Signals& operator=(const Signals&) = delete;
  ~Signals();
  [[nodiscard]] static int stop() noexcept;    ///< the stop signal received, or 0
  [[nodiscard]] static bool leave() noexcept;  ///< SIGUSR2 received

  /// Installs the same handlers now, for the start-up (call it first thing in main(), before MPI_Init):
  /// a stop or leave signal that arrives while the options are read, MPI starts or the data loads (Slurm's
  /// --signal=B:USR1@T forwarded early, a preemption's SIGTERM) is recorded instead of ending the process,
  /// and the first Signals made afterwards (the trainer's) keeps it: the group acts on it at its first
  /// agreement (checkpoint, exit code 75), as on a signal during training. That Signals restores, when it
  /// ends, the handlers that were there before this call. Not thread-safe; a second call does nothing.
  static void catch_early();

 private:
  void (*old_usr1_)(int) = nullptr;
  void (*old_term_)(int) = nullptr;
  void (*old_usr2_)(int) = nullptr;
};

/// What the group agreed at a step boundary.
struct Decision {
  bool agreed = false;          ///< false: not a control point, nothing to do
  int stop_signal = 0;          ///< > 0: checkpoint and stop (exit code 75)
  std::vector<bool> leaving;    ///< members (by rank) that asked to leave
  int asked = 0;                ///< how many
  bool async_pending = false;   ///< some rank is not done with the background checkpoint's stage
  bool checkpoint_due = false;  ///< a periodic checkpoint falls on this step
  bool resize_due = false;      ///< the job server's schedule asks for another size
};

class StepControl {
 public:
  /// `schedule`: the job server's (step, size) points (parse_resize_schedule); `max_ranks` 0: launch size.
  StepControl(std::vector<std::pair<std::int64_t, int>> schedule, int max_ranks,
              std::int64_t checkpoint_every);

  /// The size the group should have now: the job server's schedule, or after ranks left on request that
  /// size, else --max-ranks (or the launch size).
  [[nodiscard]] int target_size(const Position& p) const;
  [[nodiscard]] bool has_schedule() const noexcept { return !schedule_.empty(); }

  /// Collective at a step boundary (after step p.step) if it is a control point; local otherwise.
  /// `checkpointing`: checkpoints are on; `async_in_flight`/`async_ready`: the writer's background save.
  Decision agree(const Position& p, comm::Backend& backend, const comm::Options& op, bool checkpointing,
                 bool async_in_flight, bool async_ready) const;

 private:
  std::vector<std::pair<std::int64_t, int>> schedule_;
  int max_ranks_;
  std::int64_t checkpoint_every_;
  Signals signals_;
};

}  // namespace sinew::train
