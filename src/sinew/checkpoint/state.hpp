// The training state a checkpoint holds: everything needed to continue a run exactly where it stopped,
// at the same or another world size.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "sinew/core/flat.hpp"

namespace sinew::checkpoint {

/// Schema version written into every manifest (2: shard data offsets, commit record); readers read 1 and
/// 2 and refuse versions they do not know.
inline constexpr int kSchemaVersion = 2;

struct TrainingState {
  /// Flat float tensors by name, each the full (unsharded) tensor: "params", optimiser state such as
  /// "optim/momentum", "optim/adam_m", "optim/adam_v", and algorithm state such as "algo/residual".
  std::map<std::string, std::vector<float>> tensors;
  std::int64_t step = 0;             ///< optimiser steps taken
  std::int64_t epoch = 0;            ///< sampler epoch
  std::uint64_t cursor = 0;          ///< samples of the epoch consumed by the whole group
  std::uint64_t dataset_size = 0;    ///< training samples (a resume with other data is refused)
  std::uint64_t seed = 0;            ///< seed of initialisation and data order (drives every RNG)
  std::int64_t optimizer_steps = 0;  ///< the optimiser's own step count (Adam bias correction)
  std::int32_t world_size = 0;       ///< ranks that wrote it
  std::string config_json;           ///< the run's configuration, as JSON
  std::vector<TensorView> views;     ///< per-layer views of the tensors (may be empty)
  std::string model_json;            ///< the model's layers as JSON, for readers (may be empty)
  /// The workload's state beside the tensors, as text (workload::Workload::extra_state(); the Python
  /// package's LR scheduler and registered objects, base64): attribute `workload_state`, absent if empty.
  std::string workload_state;
};

/// One tensor of the state to save, by reference: either the whole tensor (the same on every rank, as the
/// model in data-parallel training) or, with `per_rank`, this rank's block of a tensor whose blocks differ
/// between ranks (the whole tensor is the blocks of all ranks in rank order, each of the same size).
/// With `whole` > 0, `data` is this rank's slice of a whole tensor of `whole` elements (the writer's
/// balanced slice: a sharded state's own shard, train/shards.hpp), the other slices being other ranks'.
struct TensorRef {
  std::span<const float> data;
  bool per_rank = false;
  std::uint64_t whole = 0;
};
/// The state to save without copying it first: `meta` holds every field but the tensors.
struct StateRef {
  TrainingState meta;
  std::map<std::string, TensorRef> tensors;
};
/// A StateRef over `state`'s tensors (whole tensors); valid while `state` is.
inline StateRef ref_of(const TrainingState& state) {
  StateRef ref;
  ref.meta.step = state.step;
  ref.meta.epoch = state.epoch;
  ref.meta.cursor = state.cursor;
  ref.meta.dataset_size = state.dataset_size;
  ref.meta.seed = state.seed;
  ref.meta.optimizer_steps = state.optimizer_steps;
  ref.meta.world_size = state.world_size;
  ref.meta.config_json = state.config_json;
  ref.meta.views = state.views;
  ref.meta.model_json = state.model_json;
  ref.meta.workload_state = state.workload_state;
  for (const auto& [name, v] : state.tensors) ref.tensors[name] = TensorRef{v, false};
  return ref;
}

}  // namespace sinew::checkpoint
