// Checked CUDA runtime and cuBLAS calls, like mpi/check.hpp for MPI: every status code goes through a check
// that throws a Sinew error naming the call, the error and the call site.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "sinew/core/error.hpp"

namespace sinew::cuda {

/// A failed CUDA runtime or cuBLAS call (exit code kFailure: nothing the user typed was wrong). A sticky
/// error (an illegal address in a kernel) leaves the context unusable, so no caller tries to recover from
/// this: it ends the run like any other unexpected error.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// cuBLAS' name for a status ("CUBLAS_STATUS_INVALID_VALUE").
const char* cublas_status_name(cublasStatus_t status) noexcept;

/// Throws CudaError naming `call`, the error's name and text, unless `code` is cudaSuccess.
void check(cudaError_t code, const char* call, const SourceLocation& where = SourceLocation::current());
/// Throws CudaError naming `call` and the status, unless `status` is CUBLAS_STATUS_SUCCESS.
void check(cublasStatus_t status, const char* call, const SourceLocation& where = SourceLocation::current());

/// After a kernel launch (launches return no status): throws CudaError naming `kernel` if the launch
/// failed (bad configuration, no kernel image for this GPU) or an earlier asynchronous error is pending.
void check_last_launch(const char* kernel, const SourceLocation& where = SourceLocation::current());

}  // namespace sinew::cuda

/// Calls a CUDA runtime function and throws sinew::cuda::CudaError naming it if it does not return
/// cudaSuccess.
#define SINEW_CUDA(call) ::sinew::cuda::check(static_cast<cudaError_t>(call), #call)
/// Calls a cuBLAS function and throws sinew::cuda::CudaError naming it if it does not return
/// CUBLAS_STATUS_SUCCESS.
#define SINEW_CUBLAS(call) ::sinew::cuda::check(static_cast<cublasStatus_t>(call), #call)
