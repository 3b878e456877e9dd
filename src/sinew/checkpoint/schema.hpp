// The metadata every file of a checkpoint carries (schema version 1, docs/checkpoint-format.md), shared
// by the writer and the reader. Internal to the checkpoint layer.
#pragma once

#include <hdf5.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sinew/checkpoint/state.hpp"

namespace sinew::checkpoint::schema {

/// The tensor names of `state`, in name order. Throws InvalidArgument for a name that cannot be an HDF5
/// path or a line of the tensor_names attribute (empty, with a newline, a leading or trailing '/').
std::vector<std::string> tensor_names(const TrainingState& state);

/// Writes every field of `state` but the tensors as attributes of `f`, and the tensor `names` (one
/// attribute, a line each). `file` only names the file in messages.
void write_meta(hid_t f, const TrainingState& state, const std::vector<std::string>& names,
                const std::string& file);
/// Reads what write_meta() wrote, but the schema version and the tensor names.
TrainingState read_meta(hid_t f, const std::string& file);
/// The tensor names write_meta() wrote.
std::vector<std::string> read_tensor_names(hid_t f, const std::string& file);

/// CRC32 of `n` floats' bytes: the checksum of a tensor slice.
std::uint32_t crc32_of(const float* data, std::size_t n);

}  // namespace sinew::checkpoint::schema
