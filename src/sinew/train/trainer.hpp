// The built-in training loop: a short driver of a Session (session.hpp) over a workload that trains
// itself (Workload::train/evaluate: Sinew's Eigen models, the GPU model): sample -> forward -> backward
// (buckets reduced as they fill) -> the update, with per-epoch evaluation; a failure is recovered in place.
//
// The train layer, top down (docs/architecture.md has the diagram):
//   trainer      the built-in loop: run, step, evaluate
//   session      the runtime a loop drives: steps, boundaries, evaluation, recovery, the end
//   elastic      recover / grow / leave; owns the current view's fabric
//   fabric       per view: backend, checkpoint writer, algorithm, bucketer
//   checkpoints  when to checkpoint, failed checkpoints, resume
//   control      signals and the agreement at step boundaries, the resize schedule
//   rescale      the learning rate across resizes
//   replicated_state  the replicated state, listed once (Position + the workload's tensors)
//   events       the metrics schema; audit: the exactly-once record; summary: the outcome
//   layer_options     the command line as the lower layers take it
#pragma once

#include <memory>

#include <functional>

#include "sinew/distill/source.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/summary.hpp"

namespace sinew::data {
struct DataSplit;
}
namespace sinew::workload {
class Workload;
struct ModelSpec;
}  // namespace sinew::workload

namespace sinew::train {

/// Builds the workload of --model/--optimizer/--device over the loaded data (model::make_workload for
/// Sinew's own models); the data outlives it.
using WorkloadFactory =
    std::function<std::unique_ptr<workload::Workload>(const workload::ModelSpec&, const data::DataSplit&)>;

class Trainer {
 public:
  /// Loads the data, builds the workload with `make` and the session over `comm` (duplicated), then
  /// resumes from a checkpoint if --resume asks for one. Throws InvalidArgument (bad configuration),
  /// DataError (bad data), CheckpointError (the requested checkpoint cannot be used).
  /// `service` makes the teacher service's source for --distill-registry (sinew-train passes
  /// serve::service_source); without it that option is refused.
  Trainer(Config config, const mpi::Communicator& comm, const WorkloadFactory& make,
          const distill::ServiceFactory& service = {});
  /// The same over a group (membership::Group::attach() in sinew-train): a process spawned to replace
  /// failed ranks takes its whole state from its peers' memory instead of loading or initialising it.
  Trainer(Config config, membership::Group group, const WorkloadFactory& make,
          const distill::ServiceFactory& service = {});
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;
  ~Trainer();

  /// Trains for config.epochs (or config.max_steps), evaluating after each epoch.
  Summary run();

  /// What is trained (its parameters: workload().params()).
  [[nodiscard]] workload::Workload& workload();
  /// This process's rank in the current view (it changes when the group does).
  [[nodiscard]] int rank() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::train
