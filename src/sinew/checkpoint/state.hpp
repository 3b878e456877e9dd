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

/// A named, shaped view of a slice of one flat tensor, so that readers of the file can rebuild the model
/// without Sinew ("model/fc1/weight" over part of "params"). Written into the manifest (views.hpp).
struct TensorView {
  std::string name;                  ///< "fc1/weight": the view is "model/fc1/weight" in the manifest
  std::string tensor;                ///< the flat tensor it lies in: "params"
  std::uint64_t offset = 0;          ///< its first element within that tensor
  std::vector<std::uint64_t> shape;  ///< its shape, row-major (C order) as the elements are stored
  std::string layout;                ///< how to use it, e.g. "y = x @ weight + bias"
};

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
};

}  // namespace sinew::checkpoint
