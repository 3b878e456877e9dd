// What a run measures and reports, handed values by the session (it never sees the session): the step
// window behind each metrics line and the progress line, the totals behind the summary and its `done`
// event, the `start` event, and the `recovered` event written when the first step after a recovery completes.
#pragma once

#include <cstdint>
#include <optional>

#include "sinew/comm/backend.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/events.hpp"
#include "sinew/train/summary.hpp"

namespace sinew::train {

/// One completed step, as the session measured it.
struct StepFigures {
  std::int64_t step = 0;
  std::int64_t samples = 0;  ///< the step's global sample count
  double step_ms = 0, comm_ms = 0;
  double local_loss = 0;         ///< this rank's share of the step's mean loss
  std::uint64_t bytes_sent = 0;  ///< by this rank, for the algorithm
};

/// Where the run is when a metrics line is written.
struct Place {
  std::int64_t step = 0, epoch = 0;
  int epochs = 0;
  int world_size = 0, rank = 0;
  float lr = 0;
  double exposed_comm_ms = 0;
  std::int64_t steps_left = 0;  ///< at the current size, for the ETA
};

class RunMetrics {
 public:
  RunMetrics(const Config& cfg, Events& events) : cfg_(cfg), events_(events) {}

  /// The training of `what` starts (`announce`, rank 0 of a first launch: the start event and the log line).
  void started(const StartEvent& e, const std::string& what, std::size_t train_size, bool announce);
  /// A step completed; returns the milliseconds of the recovery it ended (negative: none pending).
  double step_done(const StepFigures& f);
  /// Whether step `step` ends a metrics window.
  [[nodiscard]] bool window_due(std::int64_t step, bool epoch_end) const;
  /// The window's metrics line (and the progress line): collective, the loss is reduced over `backend`.
  void report(comm::Backend& backend, const comm::Options& op, const Place& at, bool distilling);
  /// This rank waited `ms` for teacher logits and trained `missing` samples on labels alone (the window).
  void teacher_wait(double ms, std::int64_t missing) {
    window_.distill_wait_ms += ms;
    window_.distill_missing += missing;
  }
  /// A failure detected at `detected` was recovered: the window restarts (its partial sums included the
  /// lost step) and `event` is written when the next step completes.
  void recovering(Clock::time_point detected, const RecoveredEvent& event);

  /// The outcome so far (the session fills in what it owns: evaluation, failures, checkpoints).
  [[nodiscard]] Summary& summary() noexcept { return sum_; }
  /// The end: fills the summary's totals (steps, world size, means) and, for `algorithm`, returns it.
  Summary& done(std::int64_t steps, int world_size, const std::string& algorithm);

 private:
  struct Window {
    double loss = 0, step_ms = 0, comm_ms = 0;
    std::int64_t steps = 0, samples = 0;
    std::uint64_t bytes_sent = 0;
    double distill_wait_ms = 0;        // this rank's wait for teacher logits
    std::int64_t distill_missing = 0;  // this rank's samples trained on labels alone
  };
  struct PendingRecovery {
    Clock::time_point detected;
    RecoveredEvent event;
  };

  const Config& cfg_;
  Events& events_;
  Summary sum_;
  Window window_;
  double total_step_ms_ = 0, total_comm_ms_ = 0;
  std::int64_t total_steps_ = 0;
  Clock::time_point t0_ = Clock::now();
  Clock::time_point last_progress_ = Clock::now();
  std::optional<PendingRecovery> pending_;
};

}  // namespace sinew::train
