#include "sinew/comm/nccl/bucketer.hpp"

#include <algorithm>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::comm::nccl {

DeviceBucketer::DeviceBucketer(NcclBackend& nccl, float* grads, std::size_t n,
                               const std::vector<Range>& ready_order, DeviceBucketOptions opts)
    : nccl_(nccl), grads_(grads), opts_(std::move(opts)) {
  // The layout rules of comm::GradientBucketer, so that both devices bucket a model alike.
  if (ready_order.empty()) SINEW_THROW(InvalidArgument, "device bucketer: no gradient ranges");
  std::size_t covered = 0;
  const std::size_t target = std::max<std::size_t>(opts_.bucket_bytes / sizeof(float), 1);
  for (const Range& r : ready_order) {
    if (r.count == 0 || r.offset + r.count > n) {
      SINEW_THROW(InvalidArgument, "device bucketer: range [{}, {}) is empty or outside the {} gradients",
                  r.offset, r.offset + r.count, n);
    }
    covered += r.count;
    const bool adjacent =
        !buckets_.empty() && (r.offset + r.count == buckets_.back().range.offset ||
                              buckets_.back().range.offset + buckets_.back().range.count == r.offset);
    if (buckets_.empty() || !adjacent || buckets_.back().range.count >= target) {
      buckets_.push_back({r, 1, 0});
    } else {
      Bucket& b = buckets_.back();
      b.range.offset = std::min(b.range.offset, r.offset);
      b.range.count += r.count;
      ++b.ranges_total;
    }
    bucket_of_offset_.emplace_back(r.offset, buckets_.size() - 1);
  }
  if (covered != n) {
    SINEW_THROW(InvalidArgument,
                "device bucketer: ranges cover {} of {} gradients; they must cover each exactly once",
                covered, n);
  }
  std::sort(bucket_of_offset_.begin(), bucket_of_offset_.end());
  works_.reserve(buckets_.size());
}

std::vector<Range> DeviceBucketer::buckets() const {
  std::vector<Range> out;
  out.reserve(buckets_.size());
  for (const auto& b : buckets_) out.push_back(b.range);
  return out;
}

void DeviceBucketer::mark_ready(Range r, cudaEvent_t ready) {
  const auto it = std::lower_bound(bucket_of_offset_.begin(), bucket_of_offset_.end(),
                                   std::make_pair(r.offset, std::size_t{0}));
  if (it == bucket_of_offset_.end() || it->first != r.offset) {
    SINEW_THROW(InvalidArgument, "device bucketer: range at offset {} is not one of the registered ranges",
                r.offset);
  }
  Bucket& b = buckets_[it->second];
  SINEW_ENFORCE(b.ranges_ready < b.ranges_total, "range at offset {} reported twice in one step", r.offset);
  // Now, not when the bucket is enqueued: the caller may record the event again for a later range, and a
  // stream wait takes the event as it is at the call. A wait for a later bucket's range placed before an
  // earlier bucket's reduction only delays that reduction when ranges arrive out of bucket order.
  if (ready != nullptr) nccl_.wait_event(ready);
  ++b.ranges_ready;
  enqueue_ready();
}

void DeviceBucketer::enqueue_ready() {
  // Bucket order on every rank: NCCL matches collectives by their order on the communicator.
  while (works_.size() < buckets_.size()) {
    const Bucket& b = buckets_[works_.size()];
    if (b.ranges_ready < b.ranges_total) return;
    if (works_.empty()) first_enqueue_ = Clock::now();
    float* data = grads_ + b.range.offset;
    if (opts_.reduce) {
      works_.push_back(opts_.reduce(data, b.range.count, b.range.offset));
    } else {
      works_.push_back(
          nccl_.allreduce(Buffer{data, b.range.count, DType::kFloat32}, ReduceOp::kSum, opts_.op));
    }
  }
}

void DeviceBucketer::finish() {
  const auto start = Clock::now();
  if (works_.size() != buckets_.size()) {
    const std::size_t enqueued = works_.size();
    rearm();
    SINEW_THROW(InternalError,
                "device bucketer: finish() with {} of {} buckets complete; mark every range ready", enqueued,
                buckets_.size());
  }
  // One deadline for the whole step, as the CPU bucketer's finish(); every poll checks all buckets' health
  // through their Works (NCCL's async error, the MPI view every millisecond).
  const auto deadline = start + opts_.op.timeout;
  std::size_t done = 0;
  try {
    for (int spins = 0; done < works_.size(); ++spins) {
      while (done < works_.size() && works_[done]->test()) ++done;
      if (done == works_.size()) break;
      if (Clock::now() > deadline) {
        nccl_.abort();
        SINEW_THROW(
            Timeout,
            "gradient allreduce did not complete within {} ms ({} of {} buckets done); a peer is dead, "
            "stopped or far behind; the NCCL communicator was aborted",
            opts_.op.timeout.count(), done, buckets_.size());
      }
      if (spins < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  } catch (...) {
    rearm();
    throw;
  }
  last_exposed_ms_ = seconds_since(start) * 1e3;
  last_comm_ms_ = seconds_since(first_enqueue_) * 1e3;
  rearm();
}

void DeviceBucketer::rearm() {
  works_.clear();
  for (auto& b : buckets_) b.ranges_ready = 0;
}

}  // namespace sinew::comm::nccl
