// The data-parallel training loop: sample -> forward -> backward (buckets reduced as they fill) ->
// fused optimiser step, with metrics, progress and per-epoch evaluation; at step boundaries the group
// agrees on what happens next (control.hpp), and a failure is recovered in place (elastic.hpp).
//
// The train layer, top down (docs/architecture.md has the diagram):
//   trainer      the loop: run, step, evaluate, step boundaries
//   elastic      recover / grow / leave; owns the current view's fabric
//   fabric       per view: backend, checkpoint writer, algorithm, bucketer
//   checkpoints  when to checkpoint, failed checkpoints, resume
//   control      signals and the agreement at step boundaries, the resize schedule
//   rescale      the learning rate across resizes
//   state        the replicated state, listed once (Position + tensors)
//   events       the metrics schema; audit: the exactly-once record; summary: the outcome
#pragma once

#include <memory>

#include "sinew/distill/source.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/summary.hpp"

namespace sinew::model {
class Model;
}

namespace sinew::train {

class Trainer {
 public:
  /// Loads the data and builds the model, optimiser and communication over `comm` (duplicated), then
  /// resumes from a checkpoint if --resume asks for one. Throws InvalidArgument (bad configuration),
  /// DataError (bad data), CheckpointError (the requested checkpoint cannot be used).
  /// `service` makes the teacher service's source for --distill-registry (sinew-train passes
  /// serve::service_source); without it that option is refused.
  Trainer(Config config, const mpi::Communicator& comm, const distill::ServiceFactory& service = {});
  /// The same over a group (membership::Group::attach() in sinew-train): a process spawned to replace
  /// failed ranks takes its whole state from its peers' memory instead of loading or initialising it.
  Trainer(Config config, membership::Group group, const distill::ServiceFactory& service = {});
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
