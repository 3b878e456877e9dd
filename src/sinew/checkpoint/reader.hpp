// Reading HDF5 checkpoints: the manifest, a verified load at any world size, and a plain export.
//
// A checkpoint is read without MPI (sinew-ckpt runs without mpirun). Every byte is checked: the manifest
// against the size and CRC32 its commit record holds, before HDF5 parses it; each shard file, whole,
// against the size and CRC32 the manifest holds. Shard files written by this version are not parsed by
// HDF5 at all: the manifest says where each tensor slice lies in them, and each byte is read once, with
// read(), straight into the tensor it belongs to, while the file's CRC32 is computed over the same bytes.
// (Shards of schema version 1 have no such offsets and go through HDF5, with one CRC32 per tensor slice.)
// catalog.hpp names the files and finds the checkpoints.
//
// On a distributed filesystem a file another client has just created can be briefly invisible
// (ENOENT/ESTALE): opening a file the commit record promises is retried for a short while (LoadOptions).
#pragma once

#include <cstdint>
#include <span>
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
    std::vector<std::uint64_t> shard_offsets;       ///< world_size + 1 entries (elements)
    std::vector<std::uint32_t> shard_crc32;         ///< world_size entries
    std::vector<std::uint64_t> shard_data_offsets;  ///< world_size entries: byte offset in each shard
                                                    ///< file (schema 2; empty in schema 1)
  };
  std::vector<Tensor> tensors;
  std::vector<std::uint64_t> shard_file_sizes;  ///< world_size entries: bytes of each shard file
  std::vector<std::uint32_t> shard_file_crc32;  ///< world_size entries: CRC32 of each whole shard file
  bool legacy_commit = false;  ///< committed by an earlier version's rename (manifest.h5.crc32)
};

struct LoadOptions {
  /// How long a file the checkpoint's records name may be missing (ENOENT/ESTALE) before it counts as
  /// missing: a distributed filesystem may show a file created by another client a little late.
  double retry_s = 1.0;
};

/// Reads and checks a checkpoint's manifest (directory or manifest.h5 path). Throws CheckpointError
/// naming the file for an uncommitted checkpoint, a missing/corrupt manifest, an unknown schema version,
/// or a manifest whose step differs from the directory name.
ManifestInfo read_manifest(const std::string& path, const LoadOptions& options = {});

/// Loads a committed checkpoint completely, verifying every shard's size and CRC32 against the manifest.
/// Works at any world size: the result holds whole tensors. Throws CheckpointError naming the bad file.
TrainingState load(const std::string& path, const LoadOptions& options = {});

/// A range of a tensor to read: elements [offset, offset + out.size()) of tensor `tensor`, into `out`.
struct ReadTarget {
  std::string tensor;
  std::uint64_t offset = 0;
  std::span<float> out;
};
/// Reads ranges of a committed checkpoint straight into the caller's memory (the live model, say): only
/// the bytes they need, each once (pread), each checked by the CRC32 of its tensor slice; a slice needed
/// only in part goes through a buffer. Returns the manifest. Throws CheckpointError naming the file if the
/// checkpoint is not valid, or naming the tensor if a range does not fit it. On an error, `out` may hold
/// part of the data. Checkpoints of schema version 1 are loaded whole, then copied.
ManifestInfo load_into(const std::string& path, const std::vector<ReadTarget>& targets,
                       const LoadOptions& options = {});

/// Checks a checkpoint as load() does, without keeping the data; empty string if valid, else the reason.
std::string verify(const std::string& path, const LoadOptions& options = {});

/// The files of a committed checkpoint that are not there now (paths): the manifest if it is missing,
/// else the shard files it names. Empty if none is missing (the checkpoint may still be damaged).
std::vector<std::string> missing_files(const std::string& path);

/// A cheap check, without reading tensor data: the manifest verifies and every shard file exists with
/// the size it records. Empty string if so, else the reason.
std::string quick_check(const std::string& path);

/// Writes `state` into one plain HDF5 file (no shards, no virtual datasets): for h5py users.
void export_plain(const TrainingState& state, const std::string& file);

}  // namespace sinew::checkpoint
