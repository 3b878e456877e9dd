#include "sinew/comm/nccl/bytegrad.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sinew/comm/nccl/api.hpp"
#include "sinew/comm/nccl/quantize.hpp"
#include "sinew/core/error.hpp"

namespace sinew::comm::nccl {

namespace {
/// Floats per segment: every segment but the last ones has this many.
std::size_t segment_of(std::size_t count, std::size_t n) {
  return std::max<std::size_t>((count + n - 1) / n, 1);
}
}  // namespace

ByteGrad::ByteGrad(NcclBackend& nccl, std::size_t max_count, std::size_t chunk)
    : nccl_(nccl), max_count_(max_count), chunk_(chunk) {
  if (chunk == 0) SINEW_THROW(InvalidArgument, "bytegrad: the chunk size must be at least 1");
  const auto n = static_cast<std::size_t>(nccl.size());
  max_seg_bytes_ = encoded_bytes(segment_of(max_count, n), chunk);
  // send and recv (n segments each), the encoded own sum (one), the gathered sums (n).
  void* p = nullptr;
  const cudaError_t e = nccl.api().device_alloc(&p, (3 * n + 1) * max_seg_bytes_);
  if (e != cudaSuccess) {
    SINEW_THROW(CommFailure, "bytegrad: allocating {} bytes of device scratch failed: {}",
                (3 * n + 1) * max_seg_bytes_, nccl.api().cuda_error_string(e));
  }
  scratch_ = static_cast<std::byte*>(p);
}

ByteGrad::~ByteGrad() {
  // The stream may still use the scratch: cudaFree waits for the device, so freeing is safe.
  nccl_.api().device_free(scratch_);
}

std::unique_ptr<Work> ByteGrad::reduce(float* data, std::size_t count, const Options& opts) {
  if (count > max_count_) {
    SINEW_THROW(InvalidArgument, "bytegrad: a bucket of {} floats exceeds the {} the scratch was sized for",
                count, max_count_);
  }
  const int r = nccl_.rank();
  const auto n = static_cast<std::size_t>(nccl_.size());
  if (n == 1 || count == 0) return nccl_.record("bytegrad (nothing to exchange)");
  const std::size_t seg = segment_of(count, n);
  const auto len = [&](std::size_t k) { return k * seg >= count ? 0 : std::min(seg, count - k * seg); };
  const std::size_t seg_bytes = encoded_bytes(seg, chunk_);
  std::byte* send = scratch_;
  std::byte* recv = send + n * max_seg_bytes_;
  std::byte* own = recv + n * max_seg_bytes_;
  std::byte* gathered = own + max_seg_bytes_;
  const cudaStream_t s = nccl_.stream();
  const auto me = static_cast<std::size_t>(r);

  for (std::size_t k = 0; k < n; ++k) {
    if (len(k) > 0) encode(data + k * seg, len(k), chunk_, send + k * seg_bytes, s);
  }
  // The intermediate Works are dropped: the stream orders what follows, and the final Work's polls see any
  // failure of these operations (NCCL's async error, the MPI view).
  nccl_.all_to_all(Buffer{send, n * seg_bytes, DType::kUInt8}, Buffer{recv, n * seg_bytes, DType::kUInt8},
                   opts);
  for (std::size_t k = 0; k < n && len(me) > 0; ++k) {
    if (k != me) decode_add(recv + k * seg_bytes, len(me), chunk_, data + me * seg, s);
  }
  if (len(me) > 0) encode(data + me * seg, len(me), chunk_, own, s);
  nccl_.allgather(Buffer{own, seg_bytes, DType::kUInt8}, Buffer{gathered, n * seg_bytes, DType::kUInt8},
                  opts);
  for (std::size_t k = 0; k < n; ++k) {
    if (len(k) > 0) decode(gathered + k * seg_bytes, len(k), chunk_, data + k * seg, s);
  }
  stats_.bytes_sent += 2 * (n - 1) * seg_bytes;
  stats_.messages_sent += 2 * (n - 1);
  return nccl_.record(fmt::format("bytegrad({} floats)", count));
}

}  // namespace sinew::comm::nccl
