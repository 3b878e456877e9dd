#include "sinew/algo/cuda/quantize.hpp"

#include "sinew/algo/cuda/kernels.hpp"
#include "sinew/algo/quantize.hpp"
#include "sinew/cuda/check.hpp"

namespace sinew::algo::cuda {

void encode(const float* x, std::size_t n, std::size_t chunk, std::byte* out, cudaStream_t s) {
  (void)algo::encoded_bytes(n, chunk);  // throws InvalidArgument for chunk 0, as the CPU codec does
  if (n == 0) return;
  detail::launch_encode(x, n, chunk, out, s);
  sinew::cuda::check_last_launch("sinew::algo::cuda::encode");
}

void decode(const std::byte* in, std::size_t n, std::size_t chunk, float* out, cudaStream_t s) {
  (void)algo::encoded_bytes(n, chunk);
  if (n == 0) return;
  detail::launch_decode(in, n, chunk, out, false, s);
  sinew::cuda::check_last_launch("sinew::algo::cuda::decode");
}

void decode_add(const std::byte* in, std::size_t n, std::size_t chunk, float* out, cudaStream_t s) {
  (void)algo::encoded_bytes(n, chunk);
  if (n == 0) return;
  detail::launch_decode(in, n, chunk, out, true, s);
  sinew::cuda::check_last_launch("sinew::algo::cuda::decode_add");
}

}  // namespace sinew::algo::cuda
