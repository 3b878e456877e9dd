// Launchers of the codec's kernels (quantize_kernels.cu), for quantize.cpp. Kept apart so that nvcc compiles
// only kernels and the CUDA runtime, and the checks and messages (fmt) stay in host C++. Each launcher only
// enqueues; the caller checks the launch with cuda::check_last_launch. Arguments are validated by the
// caller: chunk >= 1, n >= 1.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace sinew::comm::nccl::detail {

void launch_encode(const float* x, std::size_t n, std::size_t chunk, std::byte* out, cudaStream_t s);
void launch_decode(const std::byte* in, std::size_t n, std::size_t chunk, float* out, bool add,
                   cudaStream_t s);

}  // namespace sinew::comm::nccl::detail
