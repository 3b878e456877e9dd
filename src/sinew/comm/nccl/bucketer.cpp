#include "sinew/comm/nccl/bucketer.hpp"

#include <algorithm>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::comm::nccl {

DeviceBucketer::DeviceBucketer(NcclBackend& nccl, float* grads, std::size_t n,
                               const std::vector<Slice>& ready_order, DeviceBucketOptions opts)
    : nccl_(nccl),
      grads_(grads),
      opts_(std::move(opts)),
      // comm::GradientBucketer's layout, so that both devices bucket a model alike.
      layout_(ready_order, n, opts_.bucket_bytes, "device bucketer") {
  works_.reserve(num_buckets());
}

void DeviceBucketer::mark_ready(Slice r, cudaEvent_t ready) {
  // Now, not when the bucket is enqueued: the caller may record the event again for a later range, and a
  // stream wait takes the event as it is at the call. A wait for a later bucket's range placed before an
  // earlier bucket's reduction only delays that reduction when ranges arrive out of bucket order.
  if (ready != nullptr) nccl_.wait_event(ready);
  layout_.arrive(r.offset);
  enqueue_ready();
}

void DeviceBucketer::enqueue_ready() {
  // Bucket order on every rank: NCCL matches collectives by their order on the communicator.
  while (works_.size() < num_buckets()) {
    if (!layout_.complete(works_.size())) return;
    const BucketLayout::Bucket& b = layout_.buckets()[works_.size()];
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
  if (works_.size() != num_buckets()) {
    const std::size_t enqueued = works_.size();
    rearm();
    SINEW_THROW(InternalError,
                "device bucketer: finish() with {} of {} buckets complete; mark every range ready", enqueued,
                num_buckets());
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
            opts_.op.timeout.count(), done, num_buckets());
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
  layout_.rearm();
}

}  // namespace sinew::comm::nccl
