// Writing HDF5 checkpoints: sharded parallel write, a commit that holds on distributed filesystems,
// optionally in the background.
//
// Every rank builds its own shard file in memory with plain serial HDF5, then writes and fsyncs it,
// concurrently with the others. In the background (save_async) the file image is the snapshot: its slice of
// each tensor is copied once, straight from the live state into the image. In the foreground (save) the
// image holds only the file's metadata, and the slices are written from the state itself (the pieces that
// HDF5 writes into the image are given back at once), so a checkpoint takes no memory of the state's size. A
// rank dying mid-write cannot hang the others inside an MPI-IO collective (which ULFM does not cover): the
// only collectives are the backend's small ones (agreeing on success, gathering checksums), which have
// deadlines. Rank 0 then writes the manifest, fsyncs it, and creates the commit record last, with an
// exclusive create: the checkpoint exists exactly when that record does. Nothing is renamed, and a directory
// name is never used twice (a failed attempt at step N leaves its empty directory behind and the next attempt
// writes "ckpt-N.2"): both are unsafe on GlusterFS. The names of the directories and files are catalog.hpp's
// (docs/checkpoint-format.md has the full schema).
//
// Fault injection (core/fault.hpp): with WriterOptions::faults, a save calls the plan at the points
// before-shard-data, after-shard-data and before-fsync on every rank, and before-manifest and
// before-commit on the committing rank (rank 0 of the backend), each with the step of the checkpoint.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
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
  double commit_ms = 0;     ///< manifest + commit record
  bool skipped = false;     ///< a checkpoint of this step already existed
};

class Writer {
 public:
  /// `dir` is created if missing (by rank 0). Removes the .partial directories earlier versions abandoned.
  Writer(std::string dir, comm::Backend& backend, WriterOptions opts = {});

  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();

  /// Collective: writes `state` (the same on every rank, as in data-parallel training), commits it
  /// and prunes old checkpoints. Throws CheckpointError (every rank) if any rank failed to write; the
  /// previous checkpoints stay valid. Throws CommFailure/Timeout if a peer died. Completes an
  /// asynchronous save in flight first.
  SaveResult save(const TrainingState& state);
  SaveResult save(const StateRef& state);

  /// Collective: starts an asynchronous save of `state`. This rank's shard is built in memory before it
  /// returns (the one copy of its slice of the state: `state` may change afterwards). The rest goes
  /// through two background stages, each started by progress_async() once every rank is ready for it:
  /// each rank computes its shard's CRC32, writes and syncs it on a background thread while training goes
  /// on; then (after a small collective that gathers the shards' checksums) rank 0 writes the manifest,
  /// syncs it and creates the commit record on a background thread. At most one save is in flight: a save
  /// in flight is completed first. Returns false if this step is already committed.
  bool save_async(const StateRef& state);
  bool save_async(const TrainingState& state) { return save_async(ref_of(state)); }
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
  struct Shard;   // this rank's shard, built in memory (writer.cpp)
  struct Local {  // one rank's shard write
    bool ok = false;
    std::uint64_t bytes = 0;
    std::uint64_t file_size = 0;
    std::uint32_t file_crc32 = 0;
    std::vector<std::uint32_t> crcs;          // per tensor slice
    std::vector<std::uint64_t> data_offsets;  // per tensor slice: byte offset in the shard file
    std::string why;
  };
  struct Plan;      // what one save writes where (writer.cpp)
  struct Gathered;  // every rank's outcome and checksums, agreed on (writer.cpp)
  struct Async {
    std::unique_ptr<Plan> plan;
    std::unique_ptr<Shard> shard;
    Local local;
    double write_ms = 0;
    std::chrono::steady_clock::time_point start, commit_start;
    std::atomic<bool> done{false};  // this rank's part of the current stage
    std::thread thread;
    std::unique_ptr<Gathered> gathered;  // set once the shards are written: stage two (rank 0 commits)
    std::string why;                     // rank 0: why the commit failed (empty: committed)
    double commit_ms = 0;
    Async();
    Async(const Async&) = delete;
    Async& operator=(const Async&) = delete;
    Async(Async&&) = delete;
    Async& operator=(Async&&) = delete;
    ~Async();
  };
  /// Collective: picks the directory of this save; nullptr if the step is already committed.
  std::unique_ptr<Plan> prepare(const StateRef& state);
  /// Local: builds this rank's shard in memory (the one copy of its slice of the state); `streamed`: the
  /// image without the data, which write_local() writes from the state itself (a save in the foreground,
  /// while the state holds still: no memory of the state's size beside it).
  std::unique_ptr<Shard> build(const Plan& plan, const StateRef& state, bool streamed) const;
  Local write_local(const Plan& plan, Shard& shard) const;                 // local I/O only
  Gathered gather(const Plan& plan, const Local& local, double write_ms);  // collective
  /// Rank 0, local: manifest, fsyncs, commit record, prune. Returns why it failed, empty if committed.
  [[nodiscard]] std::string commit_local(const Plan& plan, const Gathered& g) const;
  SaveResult announce(SaveResult res, const std::string& why);  // collective: rank 0's outcome

  std::string dir_;
  comm::Backend& backend_;
  WriterOptions opts_;
  std::unique_ptr<Async> async_;
  // The last shard's memory, for the next one: its pages are mapped already (a page fault per 4 KiB is
  // much of the cost of a checkpoint otherwise). Set by write_local() on the writer thread.
  mutable std::mutex spare_mutex_;
  mutable std::unique_ptr<Shard> spare_;
};

}  // namespace sinew::checkpoint
