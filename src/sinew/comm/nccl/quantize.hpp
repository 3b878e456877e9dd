// ByteGrad's 8-bit chunked codec on the GPU, for ByteGrad over NCCL (bytegrad.hpp). Its wire format is the
// 8-bit format of the CPU codec (algo/quantize.hpp, one layer up, which this header must not include):
// ceil(n / chunk) headers {float min; float scale}, then n one-byte codes; same grid (zero on the grid
// when a chunk's range holds it, 254 steps then, else 255), same 16-significant-bit step, same rounding.
// A buffer encoded on the GPU decodes on the CPU and the other way round (tests/cuda/quantize_test.cpp).
//
// Equality with the CPU codec:
//   * decode and decode_add give bit-identical floats (code * scale is exact, so fused or not, the sum
//     min + code * scale rounds once).
//   * encode writes the CPU's bytes, with two documented exceptions:
//     - a chunk whose minimum (or maximum) is a zero may store it as -0.0 where the CPU stores +0.0 or the
//       reverse (min/max of +0 and -0 depends on the order of comparison); the header compares equal as a
//       float and every decoded value is the same;
//     - the code is round((x - min) * (1 / scale) + 0.5) computed with one fused multiply-add, as the CPU
//       codec compiles on x86-64 with FMA (-march=native); a CPU build without FMA contraction may round a
//       value that lies within one float rounding of a half step the other way: that code differs by 1.
//   * a chunk with a NaN or an infinity, or a range beyond float's: the CPU codec throws, a kernel cannot.
//     The GPU writes the header {NaN, NaN} and codes 0, so that the whole chunk decodes to NaN: the
//     divergence reaches the parameters and the loss instead of being silently clipped.
//
// The three codec functions only enqueue work on stream `s` (no synchronisation) and throw InvalidArgument
// for chunk 0 (as the CPU codec does), CudaError if the launch fails. Pointers are device memory; `out` of
// encode holds encoded_bytes(n, chunk) bytes and any alignment is fine (the headers may sit at any byte
// offset of a larger message). n == 0 does nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace sinew::comm::nccl {

/// Bytes of one chunk's header {float min; float scale}.
inline constexpr std::size_t kChunkHeaderBytes = 2 * sizeof(float);

/// Bytes of the encoding of `n` floats in chunks of `chunk` elements: the CPU codec's
/// algo::encoded_bytes(n, chunk, 8). Throws InvalidArgument for chunk 0.
[[nodiscard]] std::size_t encoded_bytes(std::size_t n, std::size_t chunk);

/// Encodes the n floats at x (device) into out (device, encoded_bytes(n, chunk) bytes), on stream s.
void encode(const float* x, std::size_t n, std::size_t chunk, std::byte* out, cudaStream_t s);
/// Decodes the encoding of n floats at in (device) into out (device, n floats), on stream s.
void decode(const std::byte* in, std::size_t n, std::size_t chunk, float* out, cudaStream_t s);
/// As decode, but out += decoded: one pass to sum a peer's contribution into a buffer.
void decode_add(const std::byte* in, std::size_t n, std::size_t chunk, float* out, cudaStream_t s);

}  // namespace sinew::comm::nccl
