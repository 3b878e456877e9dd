// RAII for a CUDA stream.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "sinew/cuda/check.hpp"

namespace sinew::cuda {

/// A non-blocking stream (cudaStreamNonBlocking: it does not synchronise with the legacy default stream,
/// which other libraries may use) on the device that is current when it is created. Move-only.
class Stream {
 public:
  Stream() { SINEW_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    // Destroying a stream with work in flight is allowed: the work completes, then the stream is released.
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  /// The handle (nullptr after a move).
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  /// Blocks until all work enqueued so far has finished; throws CudaError if some of it failed.
  void synchronize() const { SINEW_CUDA(cudaStreamSynchronize(stream_)); }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace sinew::cuda
