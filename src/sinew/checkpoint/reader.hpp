// Reading HDF5 checkpoints: the manifest, a verified load at any world size, and a plain export.
//
// A checkpoint is read without MPI (sinew-ckpt runs without mpirun). Every byte is checked before HDF5
// parses it: the manifest against its sidecar's size and CRC32, each shard file against the manifest,
// each tensor slice against its own CRC32. catalog.hpp names the files and finds the checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sinew/checkpoint/state.hpp"

namespace sinew::checkpoint {

/// What a manifest says, without reading tensor data.
struct ManifestInfo {
  int schema_version = 0;
  TrainingState meta;  ///< every field but tensors
  struct Tensor {
    std::string name;
    std::uint64_t size = 0;
    std::vector<std::uint64_t> shard_offsets;  ///< world_size + 1 entries
    std::vector<std::uint32_t> shard_crc32;    ///< world_size entries
  };
  std::vector<Tensor> tensors;
  std::vector<std::uint64_t> shard_file_sizes;  ///< world_size entries: bytes of each shard file
  std::vector<std::uint32_t> shard_file_crc32;  ///< world_size entries: CRC32 of each whole shard file
};

/// Reads and checks a checkpoint's manifest (directory or manifest.h5 path). Throws CheckpointError
/// naming the file for a missing/corrupt manifest, an unknown schema version, or a manifest whose step
/// differs from the directory name.
ManifestInfo read_manifest(const std::string& path);

/// Loads a committed checkpoint completely, verifying every shard's size and CRC32 against the manifest.
/// Works at any world size: the result holds whole tensors. Throws CheckpointError naming the bad file.
TrainingState load(const std::string& path);

/// Checks a checkpoint as load() does, without keeping the data; empty string if valid, else the reason.
std::string verify(const std::string& path);

/// Writes `state` into one plain HDF5 file (no shards, no virtual datasets): for h5py users.
void export_plain(const TrainingState& state, const std::string& file);

}  // namespace sinew::checkpoint
