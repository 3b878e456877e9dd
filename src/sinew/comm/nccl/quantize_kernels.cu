// The codec's kernels. Every arithmetic step that decides a byte of the output is written with an explicit
// rounding intrinsic (__fdiv_rn, __frcp_rn, __fmaf_rn, ...), so that the bytes do not depend on nvcc's
// contraction or fast-math flags: they follow the CPU codec (algo/quantize.cpp) operation for operation.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "sinew/comm/nccl/quantize_kernels.hpp"

namespace sinew::comm::nccl::detail {
namespace {

constexpr std::size_t kHeaderBytes = 2 * sizeof(float);  // kChunkHeaderBytes (quantize.hpp)
constexpr unsigned kMaxEncodeThreads = 256;
constexpr unsigned kDecodeThreads = 256;
// Grid-stride loops cover the rest: more blocks than this only add scheduling overhead.
constexpr std::size_t kMaxBlocks = 65535;

/// `s` (>= 0, finite) rounded up to 16 significant bits (algo/quantize.cpp's step_of).
__device__ float step_of(float s) {
  unsigned bits = __float_as_uint(s);
  bits = (bits + 0xFFu) & ~0xFFu;
  return __uint_as_float(bits);
}

/// One block per chunk (grid-stride over chunks). blockDim.x is a power of two <= kMaxEncodeThreads.
__global__ void encode_kernel(const float* __restrict__ x, std::size_t n, std::size_t chunk,
                              std::size_t chunks, std::byte* __restrict__ out) {
  __shared__ float lo_s[kMaxEncodeThreads];
  __shared__ float hi_s[kMaxEncodeThreads];
  __shared__ int bad_s[kMaxEncodeThreads];
  __shared__ float origin_s;
  __shared__ float inv_s;
  auto* codes = reinterpret_cast<std::uint8_t*>(out + chunks * kHeaderBytes);
  const unsigned t = threadIdx.x;
  for (std::size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const std::size_t begin = c * chunk;
    const std::size_t len = chunk < n - begin ? chunk : n - begin;
    float lo = __int_as_float(0x7f800000);  // +inf
    float hi = __int_as_float(0xff800000);  // -inf
    int bad = 0;
    for (std::size_t i = t; i < len; i += blockDim.x) {
      const float v = x[begin + i];
      lo = fminf(lo, v);
      hi = fmaxf(hi, v);
      bad |= isfinite(v) ? 0 : 1;
    }
    lo_s[t] = lo;
    hi_s[t] = hi;
    bad_s[t] = bad;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
      if (t < stride) {
        lo_s[t] = fminf(lo_s[t], lo_s[t + stride]);
        hi_s[t] = fmaxf(hi_s[t], hi_s[t + stride]);
        bad_s[t] |= bad_s[t + stride];
      }
      __syncthreads();
    }
    if (t == 0) {
      const float mlo = lo_s[0], mhi = hi_s[0];
      const float range = __fsub_rn(mhi, mlo);
      float header[2];
      if (bad_s[0] != 0 || !isfinite(range)) {
        // The CPU codec throws here; the chunk decodes to NaN instead (see comm/nccl/quantize.hpp).
        header[0] = header[1] = __int_as_float(0x7fc00000);
        origin_s = 0.f;
        inv_s = 0.f;  // codes 0
      } else {
        float scale = step_of(__fdiv_rn(range, 255.f)), origin = mlo;
        if (mlo <= 0.f && mhi >= 0.f && range > 0.f) {
          scale = step_of(__fdiv_rn(range, 254.f));
          origin = __fmul_rn(-rintf(__fdiv_rn(-mlo, scale)), scale);
        }
        float inv = __frcp_rn(scale);
        if (!isfinite(inv)) inv = 0.f;
        header[0] = origin;
        header[1] = scale;
        origin_s = origin;
        inv_s = inv;
      }
      // The headers may sit at any byte offset of a message: copy bytes, never store a float there.
      memcpy(out + c * kHeaderBytes, header, kHeaderBytes);
    }
    __syncthreads();
    const float origin = origin_s, inv = inv_s;
    for (std::size_t i = t; i < len; i += blockDim.x) {
      // As the CPU: clamp((v - lo) * inv + 0.5, 0, 255) truncated, the multiply-add fused.
      const float q = __fmaf_rn(__fsub_rn(x[begin + i], origin), inv, 0.5f);
      codes[begin + i] = static_cast<std::uint8_t>(static_cast<unsigned>(fminf(fmaxf(q, 0.f), 255.f)));
    }
    __syncthreads();  // origin_s, inv_s and the reduction arrays are reused by the next chunk
  }
}

/// One thread per element (grid-stride). `aligned`: the headers are 4-byte aligned and can be read as
/// floats; otherwise they are read byte by byte.
template <bool kAdd>
__global__ void decode_kernel(const std::byte* __restrict__ in, std::size_t n, std::size_t chunk,
                              std::size_t chunks, bool aligned, float* __restrict__ out) {
  const auto* codes = reinterpret_cast<const std::uint8_t*>(in + chunks * kHeaderBytes);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::size_t c = i / chunk;
    float header[2];
    if (aligned) {
      const auto* h = reinterpret_cast<const float*>(in + c * kHeaderBytes);
      header[0] = h[0];
      header[1] = h[1];
    } else {
      memcpy(header, in + c * kHeaderBytes, kHeaderBytes);
    }
    // code * scale is exact (16-bit step times an 8-bit code), so the fused and the unfused sum agree.
    const float v = __fmaf_rn(static_cast<float>(codes[i]), header[1], header[0]);
    if constexpr (kAdd) {
      out[i] = __fadd_rn(out[i], v);
    } else {
      out[i] = v;
    }
  }
}

unsigned blocks_for(std::size_t work, std::size_t per_block) {
  const std::size_t blocks = (work + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

}  // namespace

void launch_encode(const float* x, std::size_t n, std::size_t chunk, std::byte* out, cudaStream_t s) {
  const std::size_t chunks = (n + chunk - 1) / chunk;
  // A warp for small chunks, 256 threads for large ones (both powers of two, as the reduction needs).
  const unsigned threads = chunk >= kMaxEncodeThreads ? kMaxEncodeThreads : 32;
  encode_kernel<<<blocks_for(chunks, 1), threads, 0, s>>>(x, n, chunk, chunks, out);
}

void launch_decode(const std::byte* in, std::size_t n, std::size_t chunk, float* out, bool add,
                   cudaStream_t s) {
  const std::size_t chunks = (n + chunk - 1) / chunk;
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % alignof(float) == 0;
  const unsigned blocks = blocks_for(n, kDecodeThreads);
  if (add) {
    decode_kernel<true><<<blocks, kDecodeThreads, 0, s>>>(in, n, chunk, chunks, aligned, out);
  } else {
    decode_kernel<false><<<blocks, kDecodeThreads, 0, s>>>(in, n, chunk, chunks, aligned, out);
  }
}

}  // namespace sinew::comm::nccl::detail
