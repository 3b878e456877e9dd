// What a finished run reports, and the process exit code it maps to (docs/usage.md). One type: the metrics'
// `done` event (to_json) and the Python package's summary dict are both made from it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace sinew::train {

/// Rank 0's view of a run; the agreed values are the same on every rank.
struct Summary {
  /// NaN (null in JSON, None in Python) until Sinew evaluated the model: a script's own loop evaluates
  /// itself.
  double test_accuracy = std::numeric_limits<double>::quiet_NaN();
  double test_loss = std::numeric_limits<double>::quiet_NaN();
  double train_loss = 0;  ///< the mean loss of the last metrics window
  std::int64_t steps = 0;
  int epochs = 0;
  std::int64_t samples = 0;  ///< training samples consumed by the whole group
  int world_size = 0;        ///< the group's size at the end
  int failures = 0;          ///< recoveries from failed ranks this process lived through
  double wall_s = 0;
  double step_ms = 0;  ///< mean step time
  double comm_ms = 0;  ///< mean communication time per step
  double samples_per_s = 0;
  double train_s = 0;  ///< time inside steps
  std::string algorithm;
  std::uint64_t bytes_sent = 0;  ///< bytes this rank sent for the communication algorithm
  double bytes_sent_per_step = 0;
  double checkpoint_ms = 0;      ///< main-thread time spent on periodic checkpoints (not in step times)
  int stopped_by_signal = 0;     ///< SIGUSR1/SIGTERM stopped the run after a checkpoint (exit code 75)
  bool below_min_ranks = false;  ///< the group fell below --min-ranks: checkpointed and stopped (exit 75)
  std::string checkpoint_error;  ///< last checkpoint failure, if any (the run then exits with code 4)
  bool left = false;             ///< this rank left the group on request (job server, SIGUSR2): exit 0
  // Distillation only (`teacher` set): rank 0's totals.
  std::string teacher;  ///< the logit source, as described in the log
  double distill_wait_ms_per_step = 0;
  std::int64_t distill_missing = 0, distill_failed_requests = 0, distill_failovers = 0;

  /// The process exit code of this outcome: 0 done or left on request; 75 (relaunch) below --min-ranks
  /// or stopped by a signal after a checkpoint; 4 when training finished but a checkpoint failed.
  [[nodiscard]] int exit_code() const noexcept;
};

/// The metrics' `done` event: {"event": "done", the outcome's fields} (docs/metrics.md).
nlohmann::json to_json(const Summary& s);

}  // namespace sinew::train
