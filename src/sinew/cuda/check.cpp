#include "sinew/cuda/check.hpp"

#include <fmt/format.h>

namespace sinew::cuda {

const char* cublas_status_name(cublasStatus_t status) noexcept {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED (no usable GPU or driver?)";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

void check(cudaError_t code, const char* call, const SourceLocation& where) {
  if (code == cudaSuccess) [[likely]]
    return;
  // The runtime also leaves this error in the thread's last-error slot, where the next check_last_launch
  // would report it a second time, blamed on an unrelated kernel. Clearing it is a no-op for sticky errors
  // (a kernel fault), which keep failing every later call as they should.
  (void)cudaGetLastError();
  throw CudaError(fmt::format("{} failed: {}: {}", call, cudaGetErrorName(code), cudaGetErrorString(code)),
                  where);
}

void check(cublasStatus_t status, const char* call, const SourceLocation& where) {
  if (status == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  throw CudaError(
      fmt::format("{} failed: {} ({})", call, cublas_status_name(status), static_cast<int>(status)), where);
}

void check_last_launch(const char* kernel, const SourceLocation& where) {
  const cudaError_t code = cudaGetLastError();  // also clears a non-sticky launch error
  if (code == cudaSuccess) [[likely]]
    return;
  throw CudaError(fmt::format("launch of kernel {} failed: {}: {}", kernel, cudaGetErrorName(code),
                              cudaGetErrorString(code)),
                  where);
}

}  // namespace sinew::cuda
