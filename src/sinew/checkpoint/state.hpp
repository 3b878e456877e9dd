// The training state a checkpoint holds: everything needed to continue a run exactly where it stopped,
// at the same or another world size.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace sinew::checkpoint {

/// Schema version written into every manifest; readers refuse versions they do not know.
inline constexpr int kSchemaVersion = 1;

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
};

}  // namespace sinew::checkpoint
