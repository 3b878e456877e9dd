// The logit sources that need no service: a teacher computed inside the student's process, and a table of
// teacher logits computed beforehand (sinew-teacher precompute). The teacher service's source is in
// serve/service_source.hpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "sinew/distill/source.hpp"

namespace sinew::data {
struct Dataset;
}

namespace sinew::distill {

/// The teacher of checkpoint `path` (a checkpoint or a checkpoint root: its newest), run inside this
/// process on `train` (which must outlive the source) in the training thread. Throws CheckpointError.
std::unique_ptr<LogitSource> local_teacher(const std::string& path, const data::Dataset& train);

/// Writes the logits of every sample of `train` under the teacher of checkpoint `checkpoint` to the HDF5
/// file `out` (dataset "logits": samples x classes, sample-major, float32, attributes "classes",
/// "dataset" (data::fingerprint), "model", "step", "checkpoint"); written whole to out + ".tmp", then
/// renamed, so a partial table never looks complete. Returns the number of samples.
std::uint64_t write_logit_table(const std::string& checkpoint, const data::Dataset& train,
                                const std::string& out);

/// A table written by write_logit_table(). Throws DataError when it is unreadable, or was computed for
/// other data than `train` (the fingerprints differ).
std::unique_ptr<LogitSource> logit_table(const std::string& path, const data::Dataset& train);

}  // namespace sinew::distill
