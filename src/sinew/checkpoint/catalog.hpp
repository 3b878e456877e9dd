// The checkpoint catalog: how checkpoints are named on disk, which ones a directory holds, and which of
// them are committed.
//
// This is the one place that knows the naming scheme (docs/checkpoint-format.md):
//
//   DIR/ckpt-0000000120/                      the checkpoint of step 120 (10 digits)
//       shard-00000-of-00004.h5 ...           rank r's shard, of W writers
//       manifest.h5                           the manifest
//       COMMITTED                             the commit record, created last: "manifest.h5 <crc32> <size>"
//   DIR/ckpt-0000000120.2/                    a later attempt at step 120 (the first one failed): a
//                                             directory name is never used twice
//
// A checkpoint directory is written in place and is committed exactly when its commit record exists; no
// rename is involved, since renaming a directory is not atomic on distributed filesystems (GlusterFS loses
// entries of a directory renamed while another client looks its name up). Checkpoints of earlier Sinew
// versions were committed by renaming "ckpt-N.partial" to "ckpt-N" and carry "manifest.h5.crc32" instead
// of a commit record: they are committed too, and ".partial" directories never are.
// Only directories named as above are checkpoints; other entries are ignored. Nothing here touches MPI:
// sinew-ckpt uses the catalog without mpirun.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sinew::checkpoint {

/// File names inside a checkpoint directory.
inline constexpr std::string_view kManifestFile = "manifest.h5";
inline constexpr std::string_view kCommitFile = "COMMITTED";  ///< "manifest.h5 <crc32 hex> <size>\n"
/// The commit of earlier versions (a rename) left the manifest's size and CRC32 in this file instead.
inline constexpr std::string_view kManifestChecksumFile = "manifest.h5.crc32";  ///< "<crc32 hex> <size>\n"

/// "ckpt-0000000120": the directory name of the checkpoint of `step` (>= 0); "ckpt-0000000120.2" for the
/// second attempt at that step.
[[nodiscard]] std::string checkpoint_name(std::int64_t step, int attempt = 1);
/// "ckpt-0000000120.partial": where earlier versions wrote a checkpoint before renaming it.
[[nodiscard]] std::string partial_name(std::int64_t step);
/// "shard-00001-of-00004.h5": the shard file of `rank` among `world` writers.
[[nodiscard]] std::string shard_name(int rank, int world);

/// What a directory name says: its step, the attempt (1, 2, ...), or that it is an old ".partial".
struct Name {
  std::int64_t step = -1;
  int attempt = 1;
  bool partial = false;
};
[[nodiscard]] std::optional<Name> parse_name(std::string_view name);
/// The step a directory name stands for: "ckpt-0000000120" and "ckpt-0000000120.2" are 120 (with
/// `partial`, "ckpt-0000000120.partial" is, and only such names); nullopt for any other name.
[[nodiscard]] std::optional<std::int64_t> step_of(std::string_view name, bool partial = false);

/// DIR/ckpt-0000000120 (DIR/ckpt-0000000120.2 for attempt 2) and DIR/ckpt-0000000120.partial.
[[nodiscard]] std::string checkpoint_path(const std::string& dir, std::int64_t step, int attempt = 1);
[[nodiscard]] std::string partial_path(const std::string& dir, std::int64_t step);

/// Whether the checkpoint directory `path` is committed: it holds a commit record (or, written by an
/// earlier version, the manifest's checksum file). Says nothing about whether its data is intact.
[[nodiscard]] bool is_committed(const std::string& path);

struct Entry {
  std::string path;
  std::int64_t step = -1;
  int attempt = 1;
  bool valid = false;
  std::string reason;                ///< why it is not valid
  std::vector<std::string> missing;  ///< files its manifest names that are not there (find_latest)
};

/// Committed checkpoints under `dir`, newest first (by step, then attempt); with `check`, each one
/// verified (reads all data: reader.hpp's verify()). Without `check`, each one counts as valid. A missing
/// `dir` has none.
std::vector<Entry> scan(const std::string& dir, bool check);

/// The directories under `dir` that are named like checkpoints but not committed (writes in progress,
/// abandoned or failed, and old ".partial" ones), newest first; never valid, with the reason saying so.
std::vector<Entry> scan_uncommitted(const std::string& dir);

/// How find_latest() treats a committed checkpoint whose files are missing. On a distributed filesystem
/// a file on an unreachable server reads as missing (GlusterFS: ENOENT), not as an I/O error, and comes
/// back with the server.
struct FindOptions {
  double wait_s = 0;  ///< how long, in all, to wait for missing files to reappear before falling back
  /// Check each candidate cheaply (reader.hpp's quick_check(): manifest and file sizes, no tensor data)
  /// instead of verifying all its data: for a caller that verifies the data as it loads it.
  bool quick = false;
  /// Only checkpoints of steps below this one (to go on searching past one that failed to load).
  std::int64_t below_step = std::numeric_limits<std::int64_t>::max();
  /// Called when find_latest() starts waiting for `entry`'s missing files (entry.missing names them).
  std::function<void(const Entry& entry)> on_wait;
  /// Called when they reappeared, after `waited_s`.
  std::function<void(const Entry& entry, double waited_s)> on_found;
};

/// The newest checkpoint that verifies, and the newer ones skipped with their reasons (uncommitted
/// directories newer than it are listed too: one whose commit record is on an unreachable server looks
/// uncommitted).
struct Latest {
  std::optional<Entry> found;
  std::vector<Entry> skipped;
};
Latest find_latest(const std::string& dir, const FindOptions& options = {});

}  // namespace sinew::checkpoint
