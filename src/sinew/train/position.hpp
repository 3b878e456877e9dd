// The scalars of the training position (step, epoch, sample cursor, the lr's reference and ramp): what
// every member of the group agrees on beside the tensors. Replicated by ReplicatedState, written into
// checkpoints and the node's copy of the state (state_mirror.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace sinew::train {

/// The learning-rate rescaling ramp after a resize (LrRescaler): factor_from -> factor_to over steps.
struct LrRamp {
  double factor_from = 1;
  double factor_to = 1;
  std::int64_t start = 0;
  std::int64_t steps = 0;
};

/// The scalars of the training position. Replicated: the same on every member after synchronise().
/// Only 8-byte fields, so the struct has no padding and its bytes can be broadcast and checksummed.
struct Position {
  std::int64_t step = 0;              ///< optimiser steps completed by the group
  std::int64_t epoch = 0;             ///< the sampler's epoch
  std::int64_t cursor = 0;            ///< samples of the epoch consumed by the whole group
  std::int64_t optimizer_steps = 0;   ///< the optimiser's own count (Adam's bias correction)
  std::int64_t last_eval_epoch = -1;  ///< the last epoch evaluated on the test set
  std::int64_t launch_world = 0;      ///< group size at launch (or resume): the lr's reference
  std::int64_t sched_total = 0;       ///< lr schedule length, in steps of the reference global batch
  std::int64_t target_override = 0;   ///< > 0 after ranks left on request: do not grow back past it
  std::int64_t resumed = 0;           ///< 1 if the run started from a checkpoint
  double base_batch = 0;              ///< the reference global batch
  LrRamp ramp;
};
static_assert(std::is_trivially_copyable_v<Position>);
static_assert(sizeof(Position) == std::size_t{14} * 8, "Position must stay free of padding");

}  // namespace sinew::train
