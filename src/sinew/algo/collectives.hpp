// Allreduce algorithms for slow networks, built on the backend's point-to-point operations.
//
// Both split the buffer into size() nearly equal contiguous blocks (block_of) and sum in place.
//
// ring_allreduce: the bandwidth-optimal ring. Reduce-scatter (n-1 steps: send one block to the right
// neighbour, receive one from the left and add it), then allgather (n-1 steps: pass the reduced blocks
// on). Each rank sends 2(n-1)/n of the buffer, the minimum for an allreduce. Blocks travel in segments of
// kRingSegmentBytes, so that adding one segment overlaps with the transfer of the next. The allgather
// copies the final values, so all ranks end bitwise equal.
//
// compressed_allreduce: ByteGrad (Bagua). Each rank quantises block j of its buffer (quantize.hpp) and
// sends it to rank j; rank j sums the n contributions of its block (its own exactly, the others decoded),
// quantises the sum, and sends it to every rank; everyone, rank j included, decodes the same bytes, so all
// ranks end bitwise equal. Each rank sends about 2(n-1)/n of the buffer at one byte per element, a
// quarter of the ring's traffic (plus 8 bytes per chunk).
//
// Error bound of compressed_allreduce, per element of block j in chunk c (of `chunk` elements, counted
// from the start of the block), with s_k = (max - min) / 254 over chunk c of rank k's quantised input
// and S the same over chunk c of the sum:
//
//   |result - sum_k input_k| <= sum_{k != j} s_k / 2 + S / 2   (plus float rounding),
//
// where input_k = data_k, or data_k + residual_k with error feedback. For n ranks whose inputs span a
// range R per chunk, the sum spans at most n * R, so the error is below (2n - 1) * R / 508.
//
// Error feedback (a non-empty `residual`, same size as data, zero at the start, kept by the caller from
// call to call): each rank quantises data + residual and keeps what was lost, so that nothing is lost over
// time. Rank j also keeps the quantisation error of the reduced block j (DoubleSqueeze's two-sided
// compensation). Summed over ranks and calls, the outputs plus the final residuals equal the inputs up to
// float rounding.
//
// Both functions are collective (all ranks call them in the same order, with the same data.size() and
// chunk) and use the point-to-point tag opts.tag; other traffic on the backend must use another tag. The
// whole call must complete within opts.timeout: otherwise it throws Timeout, and a failed peer surfaces as
// the backend's CommFailure. After an exception, data and residual are unspecified and the backend
// should be aborted. With one rank both return at once and leave data (and residual) unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "sinew/comm/backend.hpp"

namespace sinew::algo {

/// What a call put on the wire from this rank; the functions add to it.
struct CommStats {
  std::uint64_t bytes_sent = 0;     ///< payload bytes this rank sent
  std::uint64_t messages_sent = 0;  ///< point-to-point messages this rank sent
};

/// Segment size of ring_allreduce's messages.
inline constexpr std::size_t kRingSegmentBytes = 256u << 10;

/// Block `i` of `parts` nearly equal contiguous blocks of `count` elements: the first count % parts
/// blocks have one element more.
struct Block {
  std::size_t offset = 0;
  std::size_t count = 0;
};
[[nodiscard]] Block block_of(std::size_t count, int parts, int i);

/// In-place sum over all ranks with the ring algorithm. `stats` may be null.
void ring_allreduce(comm::Backend& backend, std::span<float> data, const comm::Options& opts,
                    CommStats* stats = nullptr);

/// In-place approximate sum over all ranks, with 8-bit quantisation in chunks of `chunk` elements.
/// `residual`: empty (no error feedback) or data.size() floats carried from call to call. `stats` may be
/// null. Throws InvalidArgument for chunk 0 or a residual of another size (at every rank alike), and
/// for a NaN or infinite value in data + residual or in a reduced block (only at the rank that finds
/// it, before it sends that block: its peers then time out, as when a rank stops).
void compressed_allreduce(comm::Backend& backend, std::span<float> data, std::size_t chunk,
                          std::span<float> residual, const comm::Options& opts, CommStats* stats = nullptr);

}  // namespace sinew::algo
