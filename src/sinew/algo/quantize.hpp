// Min-max quantisation per chunk to 8, 4 or 2 bits per element (Bagua's ByteGrad codec, and its
// lower-precision variants), for sending gradients over slow links.
//
// A float span is split into chunks of `chunk` elements (the last one shorter). Each chunk keeps its
// grid origin `lo` and step `scale`, and a `bits`-bit code per element:
//
//   code = round((x - lo) / scale),   decoded = lo + code * scale,   0 <= code <= 2^bits - 1.
//
// Normally lo = min and scale = (max - min) / (2^bits - 1) (255, 15 or 3 steps). A chunk with
// min <= 0 <= max uses one step fewer (254, 14 or 2) and moves lo by at most half a step so that 0 is on
// the grid: exact zeros (sparse gradients) stay exactly zero. The step is rounded up to 16 significant
// bits so that code * scale is exact (a code has at most 8 bits).
//
// Error bound, per chunk, for every width:
//
//   |x - decoded| <= scale / 2 <= (max - min) / (2 * (2^bits - 2)) * (1 + 2^-15)
//
// that is (max - min) / 508 at 8 bits, / 28 at 4 bits, / 4 at 2 bits (/ 510, / 30, / 6 without zero
// inside the range); the factor 1 + 2^-15 is the step's rounding up, and float rounding adds a few ulps of
// max(|min|, |max|). A constant chunk (max == min) decodes exactly. A chunk whose range is below about
// 1e-36 (1 / scale overflows) is treated as constant: its error is then below its range.
//
// Wire format of n floats: ceil(n / chunk) headers {float min; float scale} (8 bytes each, the host's
// byte order: every rank of a job runs on the same architecture), then ceil(n * bits / 8) code bytes.
// At 8 bits a code is a byte. At 4 and 2 bits the codes are packed densely, low bits first: element i
// of the span is at bits [i * bits, (i + 1) * bits) of the code bytes (bit 0 the least significant of
// byte 0), and the unused high bits of the last byte are 0. Below 8 bits `chunk` must be a multiple of
// 8 / bits (2 or 4), so that every chunk starts on a byte. Headers first keep the codes contiguous, so
// that encoding and decoding are plain vectorised loops. The 8-bit format is the one of
// comm/nccl/quantize.hpp (the GPU codec of ByteGrad over NCCL, 8 bits only).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace sinew::algo {

inline constexpr std::size_t kChunkHeaderBytes = 2 * sizeof(float);

/// Bytes of the encoding of `n` floats in chunks of `chunk` elements at `bits` bits per element. Throws
/// InvalidArgument if bits is not 8, 4 or 2 (--bytegrad-bits), if chunk is 0, or if chunk is not a
/// multiple of 8 / bits (--compress-chunk). Every function below checks its arguments this way.
[[nodiscard]] std::size_t encoded_bytes(std::size_t n, std::size_t chunk, int bits = 8);

/// Encodes `x` into `out`, which must hold exactly encoded_bytes(x.size(), chunk, bits) bytes. Throws
/// InvalidArgument on a NaN or infinite input, or a chunk whose range (max - min) overflows float.
void encode(std::span<const float> x, std::size_t chunk, std::span<std::byte> out, int bits = 8);
/// Encodes `x` into a new byte vector.
[[nodiscard]] std::vector<std::byte> encode(std::span<const float> x, std::size_t chunk, int bits = 8);

/// Decodes `in` (the encoding of out.size() floats in chunks of `chunk` at `bits` bits) into `out`.
/// Throws InvalidArgument if the sizes do not match.
void decode(std::span<const std::byte> in, std::size_t chunk, std::span<float> out, int bits = 8);
/// As decode, but adds the decoded values to `out` (out += decoded): one pass to sum contributions.
void decode_add(std::span<const std::byte> in, std::size_t chunk, std::span<float> out, int bits = 8);

}  // namespace sinew::algo
