// The CUDA events of a PyTorch model on a GPU (built with CUDA only): one per parameter, recorded on torch's
// current stream of the model's GPU, which in an autograd hook is the stream the gradient's kernels ran on.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "sinew/cuda/check.hpp"
#include "sinew/torch/workload.hpp"

namespace sinew::pytorch {

namespace {

class CudaReadyEvents final : public ReadyEvents {
 public:
  CudaReadyEvents(int index, std::size_t n) : index_(static_cast<c10::DeviceIndex>(index)), events_(n) {
    const c10::cuda::CUDAGuard guard(index_);
    for (cudaEvent_t& e : events_) SINEW_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  CudaReadyEvents(const CudaReadyEvents&) = delete;
  CudaReadyEvents& operator=(const CudaReadyEvents&) = delete;
  CudaReadyEvents(CudaReadyEvents&&) = delete;
  CudaReadyEvents& operator=(CudaReadyEvents&&) = delete;
  ~CudaReadyEvents() override {
    for (cudaEvent_t e : events_)
      if (e != nullptr) (void)cudaEventDestroy(e);
  }

  CUevent_st* record(std::size_t i) override {
    SINEW_CUDA(cudaEventRecord(events_.at(i), c10::cuda::getCurrentCUDAStream(index_).stream()));
    return events_[i];
  }

 private:
  c10::DeviceIndex index_;
  std::vector<cudaEvent_t> events_;
};

}  // namespace

std::unique_ptr<ReadyEvents> cuda_ready_events(int index, std::size_t parameters) {
  return std::make_unique<CudaReadyEvents>(index, parameters);
}

}  // namespace sinew::pytorch
