// The checkpoint catalog: how checkpoints are named on disk, and which ones a directory holds.
//
// This is the one place that knows the naming scheme (docs/checkpoint-format.md):
//
//   DIR/ckpt-0000000120/                      the committed checkpoint of step 120 (10 digits)
//       shard-00000-of-00004.h5 ...           rank r's shard, of W writers
//       manifest.h5, manifest.h5.crc32        the manifest and its size and CRC32
//   DIR/ckpt-0000000140.partial/              a write in progress or abandoned: never loaded
//
// Only directories named exactly "ckpt-" + 10 digits are checkpoints; other entries are ignored.
// Nothing here touches MPI: sinew-ckpt uses the catalog without mpirun.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sinew::checkpoint {

/// File names inside a checkpoint directory.
inline constexpr std::string_view kManifestFile = "manifest.h5";
inline constexpr std::string_view kManifestChecksumFile = "manifest.h5.crc32";  ///< "<crc32 hex> <size>\n"

/// "ckpt-0000000120": the directory name of the committed checkpoint of `step` (>= 0).
[[nodiscard]] std::string checkpoint_name(std::int64_t step);
/// "ckpt-0000000120.partial": the directory a checkpoint of `step` is written into before its commit.
[[nodiscard]] std::string partial_name(std::int64_t step);
/// "shard-00001-of-00004.h5": the shard file of `rank` among `world` writers.
[[nodiscard]] std::string shard_name(int rank, int world);

/// The step a directory name stands for: "ckpt-0000000120" is 120 (with `partial`,
/// "ckpt-0000000120.partial" is); nullopt for any other name.
[[nodiscard]] std::optional<std::int64_t> step_of(std::string_view name, bool partial = false);

/// DIR/ckpt-0000000120 and DIR/ckpt-0000000120.partial.
[[nodiscard]] std::string checkpoint_path(const std::string& dir, std::int64_t step);
[[nodiscard]] std::string partial_path(const std::string& dir, std::int64_t step);

struct Entry {
  std::string path;
  std::int64_t step = -1;
  bool valid = false;
  std::string reason;  ///< why it is not valid
};

/// Committed checkpoints under `dir`, newest first; with `check`, each one verified (reads all data:
/// reader.hpp's verify()). Without `check`, each one counts as valid. A missing `dir` has none.
std::vector<Entry> scan(const std::string& dir, bool check);

/// The .partial directories under `dir` (writes in progress or abandoned), newest first; never valid,
/// with the reason saying so.
std::vector<Entry> scan_partial(const std::string& dir);

/// The newest checkpoint that verifies, and the newer ones skipped with their reasons.
struct Latest {
  std::optional<Entry> found;
  std::vector<Entry> skipped;
};
Latest find_latest(const std::string& dir);

}  // namespace sinew::checkpoint
