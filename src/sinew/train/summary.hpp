// What a finished run reports, and the process exit code it maps to (docs/usage.md).
#pragma once

#include <cstdint>
#include <string>

namespace sinew::train {

/// Rank 0's view of a run; the agreed values are the same on every rank.
struct Summary {
  double test_accuracy = 0;
  double test_loss = 0;
  double final_train_loss = 0;
  std::int64_t steps = 0;
  int epochs = 0;
  std::int64_t samples = 0;  ///< training samples consumed by the whole group
  double wall_s = 0;
  double mean_step_ms = 0;
  double mean_comm_ms = 0;
  double samples_per_s = 0;
  std::uint64_t bytes_sent = 0;  ///< bytes this rank sent for the communication algorithm
  double checkpoint_ms = 0;      ///< main-thread time spent on periodic checkpoints (not in step times)
  int stopped_by_signal = 0;     ///< SIGUSR1/SIGTERM stopped the run after a checkpoint (exit code 75)
  std::string checkpoint_error;  ///< last checkpoint failure, if any (the run then exits with code 4)
  int failures = 0;              ///< recoveries from failed ranks this process lived through
  int world_size = 0;            ///< the group's size at the end
  bool left = false;             ///< this rank left the group on request (job server, SIGUSR2): exit 0
  bool below_min_ranks = false;  ///< the group fell below --min-ranks: checkpointed and stopped (exit 75)

  /// The process exit code of this outcome: 0 done or left on request; 75 (relaunch) below --min-ranks
  /// or stopped by a signal after a checkpoint; 4 when training finished but a checkpoint failed.
  [[nodiscard]] int exit_code() const noexcept;
};

}  // namespace sinew::train
