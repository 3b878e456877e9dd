#include "sinew/comm/nccl/quantize.hpp"

#include "sinew/comm/nccl/quantize_kernels.hpp"
#include "sinew/core/error.hpp"
#include "sinew/cuda/check.hpp"

namespace sinew::comm::nccl {

std::size_t encoded_bytes(std::size_t n, std::size_t chunk) {
  if (chunk == 0) SINEW_THROW(InvalidArgument, "quantize: the chunk size must be at least 1 element");
  return (n + chunk - 1) / chunk * kChunkHeaderBytes + n;  // the headers, then one byte per code
}

void encode(const float* x, std::size_t n, std::size_t chunk, std::byte* out, cudaStream_t s) {
  (void)encoded_bytes(n, chunk);  // throws InvalidArgument for chunk 0, as the CPU codec does
  if (n == 0) return;
  detail::launch_encode(x, n, chunk, out, s);
  sinew::cuda::check_last_launch("sinew::comm::nccl::encode");
}

void decode(const std::byte* in, std::size_t n, std::size_t chunk, float* out, cudaStream_t s) {
  (void)encoded_bytes(n, chunk);
  if (n == 0) return;
  detail::launch_decode(in, n, chunk, out, false, s);
  sinew::cuda::check_last_launch("sinew::comm::nccl::decode");
}

void decode_add(const std::byte* in, std::size_t n, std::size_t chunk, float* out, cudaStream_t s) {
  (void)encoded_bytes(n, chunk);
  if (n == 0) return;
  detail::launch_decode(in, n, chunk, out, true, s);
  sinew::cuda::check_last_launch("sinew::comm::nccl::decode_add");
}

}  // namespace sinew::comm::nccl
