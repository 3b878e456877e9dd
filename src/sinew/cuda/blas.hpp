// RAII for a cuBLAS handle.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "sinew/cuda/check.hpp"

namespace sinew::cuda {

/// A cuBLAS handle on the current device whose calls run on `stream`. The math mode is
/// CUBLAS_PEDANTIC_MATH: plain FP32 everywhere, no TF32 tensor cores and no reduced-precision emulation
/// (which environment variables such as NVIDIA_TF32_OVERRIDE or cuBLAS' emulation switches could otherwise
/// enable behind our back), so that GPU results match the CPU's within float rounding. Move-only.
class Blas {
 public:
  explicit Blas(cudaStream_t stream) {
    SINEW_CUBLAS(cublasCreate(&handle_));
    try {
      SINEW_CUBLAS(cublasSetStream(handle_, stream));
      SINEW_CUBLAS(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH));
    } catch (...) {
      (void)cublasDestroy(handle_);
      throw;
    }
  }
  ~Blas() {
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
  }
  Blas(Blas&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Blas& operator=(Blas&& other) noexcept {
    if (this != &other) {
      if (handle_ != nullptr) (void)cublasDestroy(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  /// The handle (nullptr after a move).
  [[nodiscard]] cublasHandle_t get() const noexcept { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

}  // namespace sinew::cuda
