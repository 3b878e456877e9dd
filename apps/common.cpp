#include "common.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include <mpi.h>

#include <chrono>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/core/launch.hpp"

namespace sinew::apps {

int launcher_rank() { return launch::current().rank_or_zero(); }

namespace {
/// After an error with MPI running: wait (boundedly) for the other ranks to reach the same point. If all
/// do (the error is the same everywhere, e.g. a bad option), MPI is finalized and the process exits with
/// the error's code; mpirun would otherwise kill the job at the first non-zero exit, often before the
/// rank that prints the message has printed it. If some rank does not come (the error is rank-local), the
/// job is aborted with the code, since finalizing could wait for that rank forever.
void settle_before_exit(ExitCode code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (!initialized) {
    // An error before MPI started (a bad option) under a launcher: start MPI only to meet the others.
    if (!launch::current().launched() || MPI_Init(nullptr, nullptr) != MPI_SUCCESS) return;
  }
  // Neither MPI_Finalize nor MPI_Abort is bounded (with ULFM and a dead peer either can wait for good):
  // if they have not ended this process in time, it ends itself with the code, which its launcher and
  // the other ranks (ULFM: as one more failed process) see.
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(15));
    std::fprintf(stderr, "sinew: MPI did not shut down within 15 s of the error; exiting with code %d\n",
                 static_cast<int>(code));
    std::fflush(stderr);
    std::_Exit(static_cast<int>(code));
  }).detach();
  MPI_Request req = MPI_REQUEST_NULL;
  int done = 0;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) == MPI_SUCCESS) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (!done && std::chrono::steady_clock::now() < deadline) {
      if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (done) {
    MPI_Finalize();
  } else {
    MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  }
}

int report(const char* message, ExitCode code, bool print, bool mpi) {
  if (print) {
    std::fprintf(stderr, "sinew: error: %s\n", message);
    std::fflush(stderr);
  }
  if (mpi) settle_before_exit(code);
  return static_cast<int>(code);
}
}  // namespace

int guarded_main(const std::function<int()>& body, bool mpi) {
  try {
    return body();
  } catch (const Error& e) {
    // Usage errors are the same on every rank: the first rank prints them. Other errors may be
    // rank-specific (a file missing on one node), so every rank that meets one prints it.
    return report(e.message().c_str(), e.exit_code(),
                  e.exit_code() != ExitCode::kUsage || !mpi || launcher_rank() == 0, mpi);
  } catch (const std::exception& e) {
    return report(e.what(), ExitCode::kFailure, true, mpi);
  }
}

}  // namespace sinew::apps
