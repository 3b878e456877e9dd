// The start of a Sinew process, once for sinew-train and the torch job (the Python package): SIGPIPE
// ignored, MPI started (bounded for a process spawned to replace failed ranks), the group joined (a
// first-launch member, a hot spare, or a spawned replacement taken in by its parents), watched for stalls,
// logging set up; and its end: a bounded MPI_Finalize.
#pragma once

#include <chrono>
#include <optional>

#include "sinew/membership/group.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/train/config.hpp"

namespace sinew::train {

class Process {
 public:
  /// How long a finished process waits for MPI_Finalize (mpi::Environment::finalize). A healthy finalize
  /// takes well under a second, also with four ranks on two cores.
  static constexpr std::chrono::milliseconds kFinalizeBound{5000};

  /// Starts this process for `cfg`; `spawn` is the command a replacement is started with (recorded before
  /// MPI_Init can touch argv). A spawned process whose MPI_Init fails leaves at once (exit 0); one that
  /// cannot join its parents finalizes and has no group: joined() is false, and it leaves with exit 0.
  /// Throws CommFailure (a first-launch member that cannot start MPI).
  Process(const Config& cfg, membership::SpawnCommand spawn, int* argc, char*** argv);
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  Process(Process&&) = delete;
  Process& operator=(Process&&) = delete;
  ~Process() = default;

  [[nodiscard]] bool joined() const noexcept { return group_.has_value(); }
  /// The group, for the session (once).
  [[nodiscard]] membership::Group take_group();
  /// This process's rank and size while the group is still here (before take_group()).
  [[nodiscard]] const membership::Group& group() const { return *group_; }
  /// Bounded MPI_Finalize, then the process ends with `code` if the library hangs; returns `code`.
  int finalize(int code);

 private:
  std::optional<mpi::Environment> env_;
  std::optional<membership::Group> group_;
};

}  // namespace sinew::train
