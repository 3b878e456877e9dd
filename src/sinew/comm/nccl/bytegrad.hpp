// ByteGrad over NCCL (Bagua's compressed allreduce): one bucket of device floats summed over the ranks in
// 8-bit min-max quantised form (the format of algo/quantize.hpp's codec, on the GPU: comm/nccl/quantize.hpp),
// about a quarter of the bytes of a float allreduce.
//
// Everything is enqueued on the NCCL backend's communication stream; the host never waits:
//   1. the bucket is cut into size() segments (the last ones shorter or empty); segment k is encoded for
//      rank k;
//   2. all_to_all: rank k receives every rank's encoding of segment k;
//   3. each rank adds the others' decoded contributions to its own segment (its own stays exact, as in the
//      CPU algorithm), then encodes the sum once;
//   4. allgather of the encoded sums; every rank (the owner too, so that all hold the same values) decodes
//      them into the bucket.
// Error feedback is not applied here. Device scratch buffers are sized once, for the largest bucket.
#pragma once

#include <cstddef>
#include <memory>

#include "sinew/comm/backend.hpp"
#include "sinew/comm/nccl/backend.hpp"

namespace sinew::comm::nccl {

class ByteGrad {
 public:
  /// Scratch for buckets of up to `max_count` floats, encoded in chunks of `chunk` floats (> 0).
  ByteGrad(NcclBackend& nccl, std::size_t max_count, std::size_t chunk);
  ByteGrad(const ByteGrad&) = delete;
  ByteGrad& operator=(const ByteGrad&) = delete;
  ByteGrad(ByteGrad&&) = delete;
  ByteGrad& operator=(ByteGrad&&) = delete;
  ~ByteGrad();

  /// Enqueues the sum over ranks of the `count` device floats at `data`, in place (count <= max_count), and
  /// returns a Work that completes with it. `opts.timeout` bounds the issue of the NCCL calls; the Work's
  /// wait() takes the completion's deadline. Throws CommFailure (backend aborted) if enqueueing fails.
  std::unique_ptr<Work> reduce(float* data, std::size_t count, const Options& opts = {});

  /// Payload bytes and messages this rank put on the wire (per peer, both phases).
  [[nodiscard]] const CommStats& stats() const noexcept { return stats_; }

 private:
  NcclBackend& nccl_;
  std::size_t max_count_;
  std::size_t chunk_;
  std::byte* scratch_ = nullptr;  // device: [send | recv | gather_in | gather_out]
  std::size_t max_seg_bytes_ = 0;
  CommStats stats_;
};

}  // namespace sinew::comm::nccl
