// The elastic controller: changes of membership, carried out in place.
//
//   recover   a member died (a collective failed or was revoked): abort the view's fabric (revoke, so
//             that no member stays blocked in it) -> shrink the group to the survivors (revoke, shrink,
//             agree; membership::Group) -> build a new fabric -> synchronise the state from the most
//             advanced survivor -> rescale the lr -> grow back to the target size (spawn). Retried from the
//             abort if members fail during any of these steps.
//   grow_to   promote hot spares, else spawn new members (job server, or replacing failed ones); they
//             take the state from memory.
//   leave     members asked to go (SIGUSR2, job server) split off at a step boundary; not a failure.
// The controller owns the current view's fabric and writes the membership events (failure, shrink, grow,
// rescale) and their timings.
#pragma once

#include <memory>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/control.hpp"
#include "sinew/train/events.hpp"
#include "sinew/train/fabric.hpp"
#include "sinew/train/replicated_state.hpp"
#include "sinew/train/rescale.hpp"

namespace sinew::train {

/// What a recovery did, for the loop.
struct RecoveryReport {
  Clock::time_point detected;  ///< when the failure was seen
  int world_size = 0;          ///< after shrinking and growing back
};

class ElasticController {
 public:
  ElasticController(const Config& cfg, membership::Group& group, const FabricSetup& setup,
                    ReplicatedState& state, LrRescaler& lr, const StepControl& control, Events& events,
                    const fault::Plan& faults);

  /// Collective: builds the fabric over the current view (and lets a new rank 0 take the metrics over).
  void connect();
  [[nodiscard]] Fabric& fabric() noexcept { return *fabric_; }
  /// Collective after a change: the state of the most advanced member everywhere (after a failure, with
  /// an algorithm whose ranks step on their own, as of the last step every member completed); the
  /// algorithm restarts. Returns milliseconds.
  double synchronise(bool after_failure = false);
  /// After a resize: the lr factor for the new size, as a rescale event (and a log line).
  void rescale(int from_world, const char* why);

  /// Collective over the survivors, after `e`: see above. Retried until it succeeds; throws only what
  /// cannot be recovered (e.g. no ULFM: CommFailure).
  RecoveryReport recover(const CommFailure& e);
  /// A relaunch (collective): if a node's copy of the state (--state-mirror) is newer than the checkpoint
  /// just loaded, every member takes the newest one from the nodes that kept it (`generation`: the launch's).
  void resume_from_mirror(int generation);
  /// Collective: spawns members up to `target`. A spawn that fails with every member alive (no free
  /// slots) leaves the group at its size and does not try again (a grow event with the error).
  void grow_to(int target, const char* why);
  /// Collective: the members marked in `leaving` leave the group; returns true on a leaving member.
  bool leave(const std::vector<bool>& leaving, const char* why);
  /// A hot spare just promoted by the members' reform (Group::wait_as_spare() returned true, `how` is
  /// its report): takes the steps the members take after it, and the state from their memory.
  void join_promoted(const membership::ShrinkReport& how);

 private:
  /// Collective over a new view (survivors and promoted spares alike): fabric, state, lr, then growth
  /// up to the target. Timings go to `ev` when given.
  void settle(int from, const char* why, FailureEvent* ev);

  const Config& cfg_;
  membership::Group& group_;
  const FabricSetup& setup_;
  ReplicatedState& state_;
  LrRescaler& lr_;
  const StepControl& control_;
  Events& events_;
  const fault::Plan& faults_;
  std::unique_ptr<Fabric> fabric_;
};

}  // namespace sinew::train
