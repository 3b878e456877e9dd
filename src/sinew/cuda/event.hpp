// RAII for a CUDA event.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "sinew/cuda/check.hpp"

namespace sinew::cuda {

/// An event on the device that is current when it is created. Timing is off by default
/// (cudaEventDisableTiming): such events are cheaper to record and to wait for. Move-only.
class Event {
 public:
  explicit Event(bool timing = false) {
    SINEW_CUDA(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~Event() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      if (event_ != nullptr) (void)cudaEventDestroy(event_);
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// The handle (nullptr after a move).
  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }
  /// Captures the work enqueued on `stream` so far; query()/synchronize() then wait for that work.
  void record(cudaStream_t stream) { SINEW_CUDA(cudaEventRecord(event_, stream)); }
  /// True if the captured work has finished (or nothing was recorded); throws CudaError if it failed.
  [[nodiscard]] bool query() const {
    const cudaError_t code = cudaEventQuery(event_);
    if (code == cudaErrorNotReady) {
      // Not an error, but some runtimes leave it in the thread's last-error slot, where the next
      // check_last_launch would report it; clear it only if it is that (never a real pending error).
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      return false;
    }
    SINEW_CUDA(code);
    return true;
  }
  /// Blocks until the captured work has finished; throws CudaError if it failed.
  void synchronize() const { SINEW_CUDA(cudaEventSynchronize(event_)); }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace sinew::cuda
