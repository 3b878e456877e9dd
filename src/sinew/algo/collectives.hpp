// Compressed allreduce for slow networks, built on the backend's point-to-point operations. (The exact
// ring allreduce is a backend of its own: comm/ring/backend.hpp.)
//
// compressed_allreduce: ByteGrad (Bagua). It splits the buffer into size() nearly equal contiguous blocks
// (comm::ring::block_of). Each rank quantises block j of its buffer (quantize.hpp) and
// sends it to rank j; rank j sums the n contributions of its block (its own exactly, the others decoded),
// quantises the sum, and sends it to every rank; everyone, rank j included, decodes the same bytes, so all
// ranks end bitwise equal. Each rank sends about 2(n-1)/n of the buffer at `bits` bits per element (8, 4
// or 2): a quarter, an eighth or a sixteenth of the ring's traffic (plus 8 bytes per chunk).
//
// Each block is encoded on its own (quantize.hpp): its chunks count from the start of the block, and its
// codes from bit 0 of its own code bytes, so a block of any length (odd ones too) is a complete encoding.
// Below 8 bits, `chunk` must be a multiple of 8 / bits (quantize.hpp).
//
// Error bound of compressed_allreduce, per element of block j in chunk c (of `chunk` elements, counted
// from the start of the block), with s_k = (max - min) / (2^bits - 2) over chunk c of rank k's
// quantised input and S the same over chunk c of the sum:
//
//   |result - sum_k input_k| <= sum_{k != j} s_k / 2 + S / 2   (plus the step's rounding up, a factor
//                                                              1 + 2^-15, and float rounding),
//
// where input_k = data_k, or data_k + residual_k with error feedback. For n ranks whose inputs span a
// range R per chunk, the sum spans at most n * R, so the error is below (2n - 1) * R / (2 * (2^bits - 2)):
// (2n - 1) * R / 508 at 8 bits, / 28 at 4 bits, / 4 at 2 bits.
//
// Error feedback (a non-empty `residual`, same size as data, zero at the start, kept by the caller from
// call to call): each rank quantises data + residual and keeps what was lost, so that nothing is lost over
// time. Rank j also keeps the quantisation error of the reduced block j (DoubleSqueeze's two-sided
// compensation). Summed over ranks and calls, the outputs plus the final residuals equal the inputs up to
// float rounding.
//
// The call is collective (all ranks call it in the same order, with the same data.size(), chunk and
// bits) and uses the point-to-point tag opts.tag; other traffic on the backend must use another tag. The
// whole call must complete within opts.timeout: otherwise it throws Timeout, and a failed peer surfaces
// as the backend's CommFailure. After an exception, data and residual are unspecified and the backend
// should be aborted. With one rank it returns at once and leaves data (and residual) unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "sinew/comm/backend.hpp"

namespace sinew::algo {

/// What a call put on the wire from this rank; the functions add to it.
using CommStats = comm::CommStats;

/// ByteGrad's settings for one bucket's reduction where the gradients are sharded (train/shards.hpp's
/// scatter_bucket): elements per quantisation chunk, bits per element, and the error feedback's residual of
/// that bucket (empty: none).
struct Quantization {
  std::size_t chunk = 2048;
  int bits = 8;
  std::span<float> residual;
};

/// In-place approximate sum over all ranks, with `bits`-bit quantisation (8, 4 or 2) in chunks of `chunk`
/// elements. `residual`: empty (no error feedback) or data.size() floats carried from call to call.
/// `stats` may be null. Throws InvalidArgument for chunk 0, bits not 8, 4 or 2, a chunk that is not a
/// multiple of 8 / bits, or a residual of another size (at every rank alike, even with one rank), and
/// for a NaN or infinite value in data + residual or in a reduced block (only at the rank that finds
/// it, before it sends that block: its peers then time out, as when a rank stops).
void compressed_allreduce(comm::Backend& backend, std::span<float> data, std::size_t chunk,
                          std::span<float> residual, const comm::Options& opts, CommStats* stats = nullptr,
                          int bits = 8);

/// ByteGrad's reduction for sharded gradients (train/shards.hpp, --shard gradients and parameters): the
/// same exchange as compressed_allreduce, but block k is `counts[k]` elements (the blocks contiguous, in
/// rank order, covering data: the shards' parts of a bucket) and its reduced encoding goes only to the
/// ranks q != k for which gets(k, q) is true (the shard's other holders), not to every rank. On return,
/// rank r's block r, and every block k with gets(k, r), hold the reduced values, bitwise equal on every
/// rank that holds them; the other blocks hold this rank's own contribution (plus its residual, with error
/// feedback). Error bound and feedback as compressed_allreduce's; each rank sends about (n-1)/n of the
/// buffer plus its block to each of its receivers, at `bits` bits per element. gets must be the same
/// function on every rank. Throws InvalidArgument also for counts of another length than the ranks or
/// blocks that do not cover data.
void compressed_reduce_scatter(comm::Backend& backend, std::span<float> data,
                               std::span<const std::size_t> counts, const std::function<bool(int, int)>& gets,
                               std::size_t chunk, std::span<float> residual, const comm::Options& opts,
                               CommStats* stats = nullptr, int bits = 8);

}  // namespace sinew::algo
