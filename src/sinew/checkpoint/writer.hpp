// Writing HDF5 checkpoints: sharded parallel write, atomic commit, optionally in the background.
//
// Every rank writes its own shard file with plain serial HDF5, concurrently, then fsyncs it. A rank dying
// mid-write cannot hang the others inside an MPI-IO collective (which ULFM does not cover): the only
// collectives are the backend's small ones (agreeing on success, gathering checksums), which have
// deadlines. Rank 0 then writes the manifest into the .partial directory, fsyncs it, and renames the
// directory to its final name: the checkpoint exists exactly when that rename is done. The names of the
// directories and files are catalog.hpp's (docs/checkpoint-format.md has the full schema).
//
// Fault injection (core/fault.hpp): with WriterOptions::faults, a save calls the plan at the points
// before-shard-data, after-shard-data and before-fsync on every rank, and before-manifest and
// before-rename on the committing rank (rank 0 of the backend), each with the step of the checkpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sinew/checkpoint/state.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/core/fault.hpp"

namespace sinew::checkpoint {

struct WriterOptions {
  int keep = 3;                         ///< newest committed checkpoints to keep (0: all)
  comm::Options op;                     ///< deadline of the writer's collectives
  const fault::Plan* faults = nullptr;  ///< fault injection points of this process (not owned)
};

struct SaveResult {
  std::int64_t step = 0;    ///< the checkpoint's step
  std::string path;         ///< the committed directory
  std::uint64_t bytes = 0;  ///< bytes of tensor data written by all ranks
  double write_ms = 0;      ///< until every shard was durable
  double commit_ms = 0;     ///< manifest + rename
  bool skipped = false;     ///< a checkpoint of this step already existed
};

class Writer {
 public:
  /// `dir` is created if missing (by rank 0). Removes abandoned .partial directories.
  Writer(std::string dir, comm::Backend& backend, WriterOptions opts = {});

  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();

  /// Collective: writes `state` (the same on every rank, as in data-parallel training), commits it
  /// atomically and prunes old checkpoints. Throws CheckpointError (every rank) if any rank failed to
  /// write; the previous checkpoints stay valid. Throws CommFailure/Timeout if a peer died. Completes an
  /// asynchronous save in flight first.
  SaveResult save(const TrainingState& state);

  /// Collective: starts an asynchronous save of `state` (a snapshot the writer now owns). It goes through
  /// two background stages, each started by progress_async() once every rank is ready for it: each rank
  /// writes and syncs its shard on a background thread while training goes on; then (after a small
  /// collective that gathers the shards' checksums) rank 0 writes the manifest, syncs it and renames the
  /// directory on a background thread. At most one save is in flight: a save in flight is completed
  /// first. Returns false if this step is already committed.
  bool save_async(TrainingState state);
  /// Local: whether this rank's part of the current stage is done, so that progress_async() will not
  /// wait (the caller agrees on it with the group first).
  [[nodiscard]] bool async_ready() const noexcept {
    return async_ && async_->done.load(std::memory_order_acquire);
  }
  /// Collective: moves the save in flight to its next stage, waiting for this rank's part of the
  /// current one. Returns the result once the save is committed. A failed write or commit surfaces here
  /// as CheckpointError, on every rank: never lost.
  std::optional<SaveResult> progress_async();
  /// Collective: completes the save in flight, if any (both stages, waiting as needed).
  std::optional<SaveResult> finish_async();
  [[nodiscard]] bool async_in_flight() const noexcept { return async_ != nullptr; }

  [[nodiscard]] const std::string& dir() const noexcept { return dir_; }

 private:
  struct Local {  // one rank's shard write
    bool ok = false;
    std::uint64_t bytes = 0;
    std::uint64_t file_size = 0;
    std::uint32_t file_crc32 = 0;
    std::vector<std::uint32_t> crcs;
    std::string why;
  };
  struct Gathered;  // every rank's outcome and checksums, agreed on (writer.cpp)
  struct Async {
    TrainingState state;
    Local local;
    double write_ms = 0;
    std::chrono::steady_clock::time_point start, commit_start;
    std::atomic<bool> done{false};  // this rank's part of the current stage
    std::thread thread;
    std::unique_ptr<Gathered> gathered;  // set once the shards are written: stage two (rank 0 commits)
    std::string why;                     // rank 0: why the commit failed (empty: committed)
    double commit_ms = 0;
  };
  bool prepare(const TrainingState& state);             // collective; false: already committed
  Local write_local(const TrainingState& state) const;  // local I/O only
  Gathered gather(const TrainingState& state, const Local& local, double write_ms);  // collective
  /// Rank 0, local: manifest, fsyncs, rename, prune. Returns why it failed, empty if committed.
  [[nodiscard]] std::string commit_local(const TrainingState& state, const Gathered& g) const;
  SaveResult announce(SaveResult res, const std::string& why);  // collective: rank 0's outcome

  std::string dir_;
  comm::Backend& backend_;
  WriterOptions opts_;
  std::unique_ptr<Async> async_;
};

}  // namespace sinew::checkpoint
