// What the apps share: launcher rank before MPI starts, and mapping exceptions to exit codes.
#pragma once

#include <functional>

namespace sinew::apps {

/// The rank the launcher gave this process (launch::current(): Open MPI, Slurm, PMIx, MPICH variables), 0
/// when alone. Used before MPI_Init so that only one process prints a usage error.
int launcher_rank();

/// Runs `body`, turns Sinew errors into a one-line message on stderr and the documented exit code. With
/// `mpi` (the MPI programs), an error under a launcher first meets the other ranks (or aborts the job);
/// programs that never use MPI (sinew-teacher) pass false and just exit.
int guarded_main(const std::function<int()>& body, bool mpi = true);

}  // namespace sinew::apps
