// Checkpoint policy: when the trainer checkpoints, what a failed checkpoint does, and resuming.
//
//   periodic   every --checkpoint-every steps, in the background with --checkpoint-async (two stages,
//              moved on at step boundaries once every rank is ready: control.hpp)
//   signal     SIGUSR1/SIGTERM: synchronously, then the run stops (exit code 75)
//   min-ranks  the group fell below --min-ranks: synchronously, then the run stops (exit code 75)
//   end        the run is done
// A failed checkpoint (a full disk, a dying rank inside the writer's own I/O) is reported as a checkpoint
// event with an error, and training goes on: the previous checkpoints stay valid. The run then exits with
// code 4 (Summary::checkpoint_error).
#pragma once

#include <string>

#include "sinew/train/config.hpp"
#include "sinew/train/events.hpp"
#include "sinew/train/fabric.hpp"
#include "sinew/train/replicated_state.hpp"

namespace sinew::checkpoint {
struct SaveResult;
}

namespace sinew::train {

class CheckpointPolicy {
 public:
  /// `op`: the deadline of resume's collectives.
  CheckpointPolicy(const Config& cfg, const comm::Options& op, ReplicatedState& state, Events& events,
                   int generation);

  /// Collective: writes a checkpoint of the current state (`async`: periodic ones only, in the
  /// background). Failures are reported, not thrown; CommFailure/Timeout still propagate. Returns whether
  /// a checkpoint of the current step is committed now (written, or there already); false with no
  /// checkpoint directory, a failure, or `async`.
  bool save(Fabric& fabric, const char* why, bool async = false);
  /// Collective: moves the background checkpoint in flight on: with `wait`, to its commit; without, to
  /// its next stage (the caller agreed that every rank is ready for it). No-op if none is in flight.
  void progress(Fabric& fabric, bool wait = true);
  [[nodiscard]] static bool in_flight(Fabric& fabric);

  /// Collective, at start: --resume auto|never|PATH. With auto, rank 0 picks the newest committed
  /// checkpoint whose manifest and files are all there (waiting up to --resume-wait for missing files,
  /// naming them), every rank reads it straight into the state, verifying each byte; one whose data is
  /// damaged is skipped for the next older one, and a fall-back logs how many steps are lost. Throws
  /// CheckpointError on every rank if the requested checkpoint cannot be used. Returns whether the run
  /// resumed.
  bool resume(Fabric& fabric);

  /// The last checkpoint failure (empty if none).
  [[nodiscard]] const std::string& error() const noexcept { return error_; }

 private:
  void report(Fabric& fabric, const checkpoint::SaveResult& r, const std::string& why);
  void failed(Fabric& fabric, const std::string& why, const std::string& message);
  /// Collective: rank 0's choice for --resume auto among the checkpoints below `below_step` ("" if none).
  std::string choose(Fabric& fabric, ResumeEvent& ev, std::int64_t below_step);

  const Config& cfg_;
  comm::Options op_;
  ReplicatedState& state_;
  Events& events_;
  int generation_;
  std::string config_json_;
  std::string pending_reason_ = "periodic";  // why the background checkpoint in flight was taken
  std::string error_;
  std::int64_t newest_committed_ = -1;  // rank 0, resume: the newest committed step skipped
};

}  // namespace sinew::train
