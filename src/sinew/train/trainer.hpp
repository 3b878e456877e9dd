// The data-parallel training loop: sample -> forward -> backward (buckets reduced as they fill) ->
// fused optimiser step, with metrics, progress and per-epoch evaluation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/train/config.hpp"

namespace sinew::model {
class Model;
}

namespace sinew::train {

/// What a finished run reports (rank 0's view; the same on every rank for the agreed values).
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
};

class Trainer {
 public:
  /// Loads the data and builds the model, optimiser and communication over `comm` (duplicated), then
  /// resumes from a checkpoint if --resume asks for one. Throws InvalidArgument (bad configuration),
  /// DataError (bad data), CheckpointError (the requested checkpoint cannot be used).
  Trainer(Config config, const mpi::Communicator& comm);
  /// The same over a group (membership::Group::attach() in sinew-train): a process spawned to replace
  /// failed ranks takes its whole state from its peers' memory instead of loading or initialising it.
  Trainer(Config config, membership::Group group);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  /// Trains for config.epochs (or config.max_steps), evaluating after each epoch.
  Summary run();

  [[nodiscard]] const model::Model& model() const;
  /// This process's rank in the current view (it changes when the group does).
  [[nodiscard]] int rank() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::train
