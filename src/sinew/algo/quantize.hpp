// 8-bit min-max quantisation per chunk (Bagua's ByteGrad codec), for sending gradients over slow links.
//
// A float span is split into chunks of `chunk` elements (the last one shorter). Each chunk keeps its
// grid origin `lo` and step `scale`, and one byte per element:
//
//   code = round((x - lo) / scale),   decoded = lo + code * scale.
//
// Normally lo = min and scale = (max - min) / 255. A chunk with min <= 0 <= max uses 254 steps and moves lo
// by at most half a step so that 0 is on the grid: exact zeros (sparse gradients) stay exactly zero.
// The step is rounded up to 16 significant bits so that code * scale is exact.
//
// Error bound: |x - decoded| <= scale / 2 <= (max - min) / 508 per chunk (/ 510 without zero inside),
// plus float rounding (a few ulps of max(|min|, |max|)). A constant chunk (max == min) decodes exactly.
// A chunk whose range is below about 1e-36 (1 / scale overflows) is treated as constant: its error is
// then below its range.
//
// Wire format of n floats: ceil(n / chunk) headers {float min; float scale} (8 bytes each, the host's
// byte order: every rank of a job runs on the same architecture), then the n codes, one byte each.
// Headers first keep the codes contiguous, so that encoding and decoding are plain vectorised loops.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace sinew::algo {

inline constexpr std::size_t kChunkHeaderBytes = 2 * sizeof(float);

/// Bytes of the encoding of `n` floats in chunks of `chunk` elements. Throws InvalidArgument if chunk is 0.
[[nodiscard]] std::size_t encoded_bytes(std::size_t n, std::size_t chunk);

/// Encodes `x` into `out`, which must hold exactly encoded_bytes(x.size(), chunk) bytes. Throws
/// InvalidArgument on a NaN or infinite input, or a chunk whose range (max - min) overflows float.
void encode(std::span<const float> x, std::size_t chunk, std::span<std::byte> out);
/// Encodes `x` into a new byte vector.
[[nodiscard]] std::vector<std::byte> encode(std::span<const float> x, std::size_t chunk);

/// Decodes `in` (the encoding of out.size() floats in chunks of `chunk`) into `out`. Throws
/// InvalidArgument if the sizes do not match.
void decode(std::span<const std::byte> in, std::size_t chunk, std::span<float> out);
/// As decode, but adds the decoded values to `out` (out += decoded): one pass to sum contributions.
void decode_add(std::span<const std::byte> in, std::size_t chunk, std::span<float> out);

}  // namespace sinew::algo
