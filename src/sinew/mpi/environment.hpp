// MPI start-up and shut-down, and what this MPI can do.
#pragma once

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
