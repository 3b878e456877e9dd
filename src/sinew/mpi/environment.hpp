// MPI start-up and shut-down, and what this MPI can do.
#pragma once

#include <chrono>
#include <string>

namespace sinew::mpi {

/// Initialises MPI with MPI_THREAD_MULTIPLE (gradient buckets are reduced on a communication thread)
/// and finalises it on destruction, except when destroyed by an exception: then the error handler
/// finalizes or aborts (see apps/common.cpp). One per process.
class Environment {
 public:
  Environment(int* argc, char*** argv);
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  ~Environment();

  /// Finalizes MPI, but never waits longer than `bound` for it: if MPI_Finalize has not returned by then,
  /// the process ends with `exit_code` (std::_Exit) instead of hanging. Call it only when this process's
  /// results are durable (metrics, audit and checkpoints written and closed, logs flushed): after a
  /// failure and a recovery, Open MPI 5.0.7's MPI_Finalize can wait forever for processes that died or
  /// for a spawn that never completed, and nothing after it is left to do but exit. Under
  /// `mpirun --with-ft ulfm` a process that exits 0 without finalizing does not make mpirun fail (measured:
  /// mpirun returns 0). Returns normally when MPI_Finalize did.
  void finalize(int exit_code, std::chrono::milliseconds bound);

  [[nodiscard]] int world_rank() const noexcept { return rank_; }
  [[nodiscard]] int world_size() const noexcept { return size_; }

 private:
  int rank_ = 0;
  int size_ = 1;
};

/// "Open MPI v5.0.7" or similar (MPI_Get_library_version, first line).
std::string library_version();

/// True when the MPI library has the ULFM API compiled in (MPIX_Comm_revoke/shrink/agree).
bool ulfm_compiled() noexcept;

/// True when ULFM is usable in this job: compiled in, the library is Open MPI (MPICH declares the API
/// but aborts in it, see docs/architecture.md), and the job was started with fault tolerance on
/// (`mpirun --with-ft ulfm`, read from the MPI_T control variable mpi_ft_enable).
bool ulfm_enabled();

}  // namespace sinew::mpi
