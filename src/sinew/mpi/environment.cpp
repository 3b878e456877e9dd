#include "sinew/mpi/environment.hpp"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/mpi/check.hpp"

namespace sinew::mpi {

Environment::Environment(int* argc, char*** argv) {
  // The initial error handler (Open MPI's mpi_initial_errhandler) handles errors raised when no
  // communicator is there to take them: before MPI_Init and once MPI_Finalize has torn MPI_COMM_SELF
  // down. A spawn abandoned past its deadline whose root is left in PMIx_Connect (a member died during
  // it) fails when the runtime shuts down under it, during MPI_Finalize: under the default, fatal handler
  // that aborted the job ("An error occurred in MPI_Comm_spawn ... on a NULL communicator", mpirun exit
  // 1) in 2 of 12 runs of elastic.during-spawn. Set before MPI_Init (read there; no thread of this
  // process reads the environment meanwhile); a value the user set stays.
  ::setenv("OMPI_MCA_mpi_initial_errhandler", "mpi_errors_return", 0);  // NOLINT(concurrency-mt-unsafe)
  int provided = 0;
  const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  if (rc != MPI_SUCCESS) SINEW_THROW(CommFailure, "MPI_Init_thread failed: {}", error_string(rc));
  SINEW_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  // Errors not tied to a communicator go to MPI_COMM_SELF's handler while it exists: returned, not an
  // abort of the whole job.
  SINEW_MPI(MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN));
  SINEW_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  SINEW_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  if (provided < MPI_THREAD_MULTIPLE) {
    SINEW_THROW(
        CommFailure,
        "this MPI does not provide MPI_THREAD_MULTIPLE (got level {}); Sinew reduces gradients on a "
        "communication thread. Use an MPI built with thread support (the set-up script's Open MPI 5).",
        provided);
  }
}

Environment::~Environment() {
  // During exception unwinding the error handler above us decides: MPI_Finalize if every rank met the
  // error, MPI_Abort if only some did (finalizing then could wait forever for the others).
  if (std::uncaught_exceptions() > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void Environment::finalize(int exit_code, std::chrono::milliseconds bound) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Whatever is buffered must reach its file or pipe before a possible _Exit, which flushes nothing.
  spdlog::default_logger()->flush();
  std::fflush(nullptr);
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread guard([&] {
    std::unique_lock lock(mu);
    if (cv.wait_for(lock, bound, [&] { return done; })) return;
    // MPI_Finalize is stuck (typically: a peer that died or a spawned process that never joined is still
    // expected by the runtime). The results are durable, so ending here loses nothing.
    std::fprintf(stderr, "[sinew] MPI_Finalize did not return within %lld ms; exiting with code %d\n",
                 static_cast<long long>(bound.count()), exit_code);
    std::fflush(stderr);
    std::_Exit(exit_code);
  });
  MPI_Finalize();
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  guard.join();
}

std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string s(text, static_cast<size_t>(len));
  if (auto nl = s.find_first_of("\n,"); nl != std::string::npos) s.resize(nl);
  return s;
}

bool ulfm_compiled() noexcept { return SINEW_HAVE_ULFM != 0; }

namespace {
bool read_ulfm_enabled() {
  if (!ulfm_compiled()) return false;
  if (library_version().find("Open MPI") == std::string::npos) return false;
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return false;
  bool enabled = false;
  int index = -1;
  if (MPI_T_cvar_get_index("mpi_ft_enable", &index) == MPI_SUCCESS) {
    MPI_T_cvar_handle handle{};
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
      int value = 0;  // a bool cvar is read as an int
      if (MPI_T_cvar_read(handle, &value) == MPI_SUCCESS) enabled = value != 0;
      MPI_T_cvar_handle_free(&handle);
    }
  }
  MPI_T_finalize();
  return enabled;
}
}  // namespace

bool ulfm_enabled() {
  static const bool enabled = read_ulfm_enabled();  // fixed for the life of the job
  return enabled;
}

}  // namespace sinew::mpi
