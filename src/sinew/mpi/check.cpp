#include "sinew/mpi/check.hpp"

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#if SINEW_HAVE_ULFM
#include <mpi-ext.h>
#endif

namespace sinew::mpi {

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(len));
}

bool is_process_failure(int code) noexcept {
#if SINEW_HAVE_ULFM
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_REVOKED || cls == MPIX_ERR_PROC_FAILED_PENDING;
#else
  (void)code;
  return false;
#endif
}

void check(int code, const char* call, const SourceLocation& where) {
  if (code == MPI_SUCCESS) [[likely]]
    return;
  if (is_process_failure(code)) {
    throw CommFailure(
        fmt::format("{} failed: {} (a peer died or the group was revoked)", call, error_string(code)), where);
  }
  throw Error(fmt::format("{} failed: {}", call, error_string(code)), where);
}

}  // namespace sinew::mpi
