// Gradient bucketing with overlap, as the best data-parallel systems do it (PyTorch DDP, Horovod, Bagua).
//
// Gradients live in one flat buffer. The bucketer splits it into buckets of about `bucket_bytes`, in the
// order in which backward produces the gradients (last layer first), so each bucket is one contiguous
// range of the buffer: it is reduced in place, with no copy into a fusion buffer. As soon as backward
// reports the last gradient range of a bucket, a communication thread starts its allreduce while backward
// goes on with earlier layers. Buckets are reduced in bucket order on every rank, so all ranks issue the
// same collectives in the same order.
//
// With overlap, each bucket is reduced by the backend's blocking allreduce (the MPI library's tuned
// algorithms, measurably faster than its nonblocking ones) on the communication thread, and finish()
// bounds the wait: past the deadline it aborts the backend (with ULFM that revokes the communicator, so
// the blocked call returns at every rank) and throws Timeout. Without overlap, buckets are reduced on the
// calling thread with the nonblocking operations, each polled against its deadline.
//
// The reduction is a sum. Training makes it the exact mean over the global batch by dividing each rank's
// loss by the global number of samples in the step (see model::softmax_cross_entropy), which also stays
// exact when the last step of an epoch gives ranks unequal batches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/core/flat.hpp"

namespace sinew::comm {

/// The bucket layout that both bucketers (this one and comm/nccl/'s DeviceBucketer) use, so that a model
/// is bucketed alike on either device: the ranges in ready order, grouped into contiguous buckets of about
/// `bucket_bytes` (a new bucket starts when the next range is not adjacent or the bucket is full).
class BucketLayout {
 public:
  struct Bucket {
    Slice range;
    std::size_t ranges_total = 0;  ///< ranges that make up the bucket
  };
  /// Throws InvalidArgument (naming `who`) unless the ranges are non-empty, inside [0, n), and cover it
  /// exactly once.
  BucketLayout(const std::vector<Slice>& ready_order, std::size_t n, std::size_t bucket_bytes,
               const char* who);
  [[nodiscard]] const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  /// The bucket of the range that starts at `offset`; throws InvalidArgument for an offset that starts none.
  [[nodiscard]] std::size_t bucket_of(std::size_t offset) const;

 private:
  const char* who_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> bucket_of_offset_;  // (range offset, bucket), sorted
};

struct BucketOptions {
  std::size_t bucket_bytes = 4u << 20;  ///< target bucket size; a range larger than this is a bucket alone
  bool overlap = true;                  ///< reduce on a communication thread while backward runs
  Options op;                           ///< per-allreduce options (deadline)
  /// Replaces the backend's allreduce: reduces one bucket in place (the sum over ranks), e.g. our ring or
  /// ByteGrad (algo/). Arguments: the bucket and its offset in the gradients. It runs on the
  /// communication thread with overlap and must bound its own waits by `op.timeout`.
  std::function<void(std::span<float>, std::size_t)> reduce;
};

class GradientBucketer {
 public:
  /// `ready_order`: the ranges in the order backward reports them; together they must cover `grads`
  /// exactly once, and consecutive ranges must be adjacent (each bucket is then contiguous).
  GradientBucketer(Backend& backend, std::span<float> grads, const std::vector<Slice>& ready_order,
                   BucketOptions opts);
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;
  /// Stops the communication thread (after the bucket in flight, if any; a thread still blocked in a
  /// collective after an abort without ULFM is left behind: the process is about to exit anyway).
  ~GradientBucketer();

  /// Reported by backward: the gradients of `r` (one entry of ready_order) are final.
  void mark_ready(Slice r);
  /// Blocks until every bucket of this step is reduced, then re-arms for the next step. Rethrows a
  /// failure of the communication thread (CommFailure, Timeout). Without overlap the buckets are reduced
  /// here, on the calling thread.
  void finish();

  [[nodiscard]] std::size_t num_buckets() const noexcept { return buckets_.size(); }
  [[nodiscard]] std::vector<Slice> buckets() const;
  /// Milliseconds the last step's allreduces took on the communication thread (sum over buckets).
  [[nodiscard]] double last_comm_ms() const noexcept { return last_comm_ms_; }
  /// Milliseconds finish() blocked in the last step: communication not hidden behind backward.
  [[nodiscard]] double last_exposed_ms() const noexcept { return last_exposed_ms_; }

 private:
  struct Bucket {
    Slice range;
    std::size_t ranges_total = 0;
    std::size_t ranges_ready = 0;
  };
  void run();                                 // communication thread
  void reduce(std::size_t b, bool blocking);  // one bucket, on the calling thread

  Backend& backend_;
  std::span<float> grads_;
  BucketOptions opts_;
  BucketLayout layout_;
  std::vector<Bucket> buckets_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t reduced_ = 0;               // guarded by mu_: buckets [0, reduced_) are reduced this step
  std::exception_ptr error_;              // guarded by mu_
  bool stop_ = false;                     // guarded by mu_
  std::atomic<int> pending_{0};           // buckets complete but not yet taken by the communication thread
  std::atomic<bool> reduced_all_{false};  // reduced_ == buckets_.size(), readable without mu_
  bool busy_ = false;                     // guarded by mu_: the communication thread is inside a collective
  double comm_ms_ = 0;                    // guarded by mu_
  double last_comm_ms_ = 0;
  double last_exposed_ms_ = 0;
  std::thread thread_;
};

}  // namespace sinew::comm
