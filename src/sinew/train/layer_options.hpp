// The command line's options as each lower layer takes them. Config mirrors the command line; these build
// the lower layers' option structs from it, each in one place, so that no field is copied by hand twice.
#pragma once

#include "sinew/algo/algorithm.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/distill/distiller.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/fabric.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

/// --dataset, --data-dir, --limit-*, --seed.
[[nodiscard]] data::DatasetOptions dataset_options(const Config& c);
/// --optimizer and its settings.
[[nodiscard]] optim::OptimizerOptions optimizer_options(const Config& c);
/// --model, the optimiser, --device, --seed: a built-in workload (model::make_workload).
[[nodiscard]] workload::ModelSpec model_spec(const Config& c);
/// --algorithm and its settings.
[[nodiscard]] algo::AlgorithmOptions algorithm_options(const Config& c);
/// The options' part of every fabric: deadlines, checkpoint directory, algorithm, buckets. The caller adds
/// the workload, fault plan and callbacks.
[[nodiscard]] FabricSetup fabric_options(const Config& c);
/// --distill-alpha, --distill-temperature and the waits.
[[nodiscard]] distill::DistillOptions distill_options(const Config& c);

}  // namespace sinew::train
