// Fault injection: one mechanism for every named point where a test kills a rank (docs/fault-tolerance.md).
//
// A fault is "RANK:POINT:STEP": the process that had launch rank RANK (its rank in MPI_COMM_WORLD at
// start; spawned processes have none) raises SIGKILL, as a crash would, when it reaches POINT at STEP.
// One point stops the process instead of killing it: recovery-hang blocks it for ever at the start of a
// recovery, alive, as a repair call that never returns inside the MPI library would (the others wait for
// it in their shrink); the repair deadlines (membership/repair_watch.hpp) must end that.
// Specs are parsed and validated once, with the other options, before MPI starts (parse_fault); a Plan
// holds this process's faults and is passed to the layers that have points (train, membership,
// checkpoint). A relaunched job (restart generation > 0) gets an empty plan: it must not die the same way
// again.
//
// What STEP means depends on the point:
//   forward, backward, allreduce, optimizer   the step being trained (1-based)
//   recovery, recovery-hang, spawn            the step being trained or any later one (a recovery or a
//                                             growth happens between steps, possibly several times)
//   before-shard-data, after-shard-data,      the step of the checkpoint being written; before-manifest
//   before-fsync, before-manifest,            and before-rename only run on the rank that commits (rank 0
//   before-rename                             of the current view); checkpoint-write = after-shard-data
//   end-gather                                the last step: --shard parameters, after the end checkpoint,
//                                             before the model is gathered whole
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sinew/core/names.hpp"

namespace sinew::fault {

enum class Point : std::uint8_t {
  kForward,
  kBackward,
  kAllreduce,
  kOptimizer,
  kRecovery,
  kRecoveryHang,
  kSpawn,
  kCheckpointWrite,  ///< a shorter name for kAfterShardData
  kBeforeShardData,
  kAfterShardData,
  kBeforeFsync,
  kBeforeManifest,
  kBeforeCommit,
  kEndGather,
};

inline constexpr NameTable<Point, 14> kPointNames{{
    {Point::kForward, "forward"},
    {Point::kBackward, "backward"},
    {Point::kAllreduce, "allreduce"},
    {Point::kOptimizer, "optimizer"},
    {Point::kRecovery, "recovery"},
    {Point::kRecoveryHang, "recovery-hang"},
    {Point::kSpawn, "spawn"},
    {Point::kCheckpointWrite, "checkpoint-write"},
    {Point::kBeforeShardData, "before-shard-data"},
    {Point::kAfterShardData, "after-shard-data"},
    {Point::kBeforeFsync, "before-fsync"},
    {Point::kBeforeManifest, "before-manifest"},
    {Point::kBeforeCommit, "before-commit"},
    {Point::kEndGather, "end-gather"},
}};

struct Fault {
  int rank = -1;  ///< launch rank
  Point point = Point::kForward;
  std::int64_t step = 0;  ///< >= 1
};

/// Parses RANK:POINT:STEP. Throws InvalidArgument naming `option` and the accepted points.
Fault parse_fault(std::string_view spec, std::string_view option = "--inject-fault");

/// This process's faults. Empty by default (no injection).
class Plan {
 public:
  Plan() = default;
  /// Keeps the faults of `launch_rank` (none for -1, a spawned process); none at all when
  /// `restart_generation` > 0.
  Plan(const std::vector<Fault>& faults, int launch_rank, int restart_generation);

  /// Kills this process (SIGKILL) if a fault names `point` at `step` (see the table above for what step
  /// means), or blocks it for ever at recovery-hang. Prints one line to stderr first, with the wall-clock
  /// time of the kill (benchmarks read it).
  void at(Point point, std::int64_t step) const;

  [[nodiscard]] bool empty() const noexcept { return faults_.empty(); }
  [[nodiscard]] int launch_rank() const noexcept { return launch_rank_; }

 private:
  std::vector<Fault> faults_;
  int launch_rank_ = -1;
};

}  // namespace sinew::fault
