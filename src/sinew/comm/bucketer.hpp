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
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/core/flat.hpp"

struct CUevent_st;  // cudaEvent_t

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
  /// The buckets' ranges, in bucket order.
  [[nodiscard]] std::vector<Slice> ranges() const;
  /// The bucket of the range that starts at `offset`; throws InvalidArgument for an offset that starts none.
  [[nodiscard]] std::size_t bucket_of(std::size_t offset) const;

  /// The step's arrivals: the range that starts at `offset` is final. Returns its bucket and whether that
  /// bucket is complete now. Each range arrives once per step: the session's reducer (train/reducer.hpp)
  /// checks what callers report, so a second arrival here is a broken invariant (InternalError).
  struct Arrival {
    std::size_t bucket = 0;
    bool complete = false;
  };
  Arrival arrive(std::size_t offset);
  [[nodiscard]] bool complete(std::size_t bucket) const {
    return ready_[bucket] == buckets_[bucket].ranges_total;
  }
  /// A new step: no range has arrived.
  void rearm();

 private:
  const char* who_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> ready_;                                     // ranges arrived this step, per bucket
  std::vector<std::pair<std::size_t, std::size_t>> bucket_of_offset_;  // (range offset, bucket), sorted
};

/// What reduces a step's gradients bucket by bucket as they become final: the host bucketer below or, for
/// gradients in device memory, comm/nccl/'s DeviceBucketer. The session's fabric holds one of them and
/// its reducer drives it.
class Bucketer {
 public:
  Bucketer() = default;
  Bucketer(const Bucketer&) = delete;
  Bucketer& operator=(const Bucketer&) = delete;
  Bucketer(Bucketer&&) = delete;
  Bucketer& operator=(Bucketer&&) = delete;
  virtual ~Bucketer() = default;

  /// The gradients of `r` (one entry of the ready order) are final: now (`ready` null) or, on a device,
  /// once `ready` (an event on the compute stream) completes. Each range once per step.
  virtual void mark_ready(Slice r, CUevent_st* ready) = 0;
  void mark_ready(Slice r) { mark_ready(r, nullptr); }
  /// Blocks until every bucket of this step is reduced, then re-arms for the next step. Throws
  /// CommFailure/Timeout.
  virtual void finish() = 0;
  [[nodiscard]] virtual std::size_t num_buckets() const noexcept = 0;
  [[nodiscard]] virtual std::vector<Slice> buckets() const = 0;
  /// Milliseconds of the last step's communication.
  [[nodiscard]] virtual double last_comm_ms() const noexcept = 0;
  /// Milliseconds finish() blocked in the last step: communication not hidden behind backward.
  [[nodiscard]] virtual double last_exposed_ms() const noexcept = 0;
  /// Bytes this rank sent for its own reductions since the last call, where the bucketer's reduction is
  /// not the algorithm's (ByteGrad over NCCL); 0 otherwise.
  virtual std::uint64_t take_bytes_sent() { return 0; }
  /// A collective handed over by post_in_order(), and whether it ran (done, and its failure if any).
  struct InOrder {
    std::size_t before = 0;  ///< runs before this bucket is reduced
    std::function<void()> fn;
    bool done = false;
    std::exception_ptr error;
  };
  using Ticket = std::shared_ptr<InOrder>;
  /// Hands over `fn`, a collective over the bucketer's backend, to run in the same place among the step's
  /// bucket reductions on every rank, and returns without waiting for it: --shard parameters' prefetch of
  /// the next unit's gather. Called between the ranges' arrivals (by a hook of backward), it runs after the
  /// buckets that were complete and before the others. Base: `fn` now, on the calling thread.
  virtual Ticket post_in_order(std::function<void()> fn);
  /// Returns when `t` ran, rethrowing its failure. Waits at most the deadline (then aborts the backend:
  /// Timeout).
  virtual void wait_in_order(const Ticket& t);
  /// After a failure (the group is about to be rebuilt): `t` does not run if it has not started, and this
  /// returns when it is no longer running. Nothing is thrown. Base: nothing to do (it ran when posted).
  virtual void cancel_in_order(const Ticket& t) { (void)t; }
  /// post_in_order() and wait_in_order(): the collective now, in its place among the buckets.
  void run_in_order(std::function<void()> fn) { wait_in_order(post_in_order(std::move(fn))); }
};

struct BucketOptions {
  std::size_t bucket_bytes = 4u << 20;  ///< target bucket size; a range larger than this is a bucket alone
  bool overlap = true;                  ///< reduce on a communication thread while backward runs
  Options op;                           ///< per-allreduce options (deadline)
  /// With overlap: at most this many complete buckets wait for the communication thread; a range reported
  /// beyond that blocks backward until the thread catches up (0: no bound). Sharded parameters give a
  /// bucket's gradients back once it is reduced: without a bound a starved communication thread lets the
  /// whole model's gradients pile up.
  std::size_t max_backlog = 0;
  /// Replaces the backend's allreduce: reduces one bucket in place (the sum over ranks), e.g. our ring or
  /// ByteGrad (algo/). Arguments: the bucket and its offset in the gradients. It runs on the
  /// communication thread with overlap and must bound its own waits by `op.timeout`.
  std::function<void(std::span<float>, std::size_t)> reduce;
};

class GradientBucketer final : public Bucketer {
 public:
  /// `ready_order`: the ranges in the order backward reports them; together they must cover `grads`
  /// exactly once, and consecutive ranges must be adjacent (each bucket is then contiguous).
  GradientBucketer(Backend& backend, std::span<float> grads, const std::vector<Slice>& ready_order,
                   BucketOptions opts);
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;
  /// Stops the communication thread (after the bucket in flight, if any; a thread still blocked in a
  /// collective after an abort without ULFM is left behind: the process is about to exit anyway).
  ~GradientBucketer() override;

  using Bucketer::mark_ready;
  /// Reported by backward: the gradients of `r` (one entry of ready_order) are final. Host memory only:
  /// `ready` must be null.
  void mark_ready(Slice r, CUevent_st* ready) override;
  /// Rethrows a failure of the communication thread (CommFailure, Timeout). Without overlap the buckets
  /// are reduced here, on the calling thread.
  void finish() override;
  /// With overlap, on the communication thread: before bucket b, where b is the first bucket that was not
  /// complete when `fn` was handed over (a deterministic point: the hooks run in autograd's order on every
  /// rank), after the collectives handed over before it. wait_in_order() waits at most the deadline (then
  /// aborts the backend, as finish()).
  Ticket post_in_order(std::function<void()> fn) override;
  void wait_in_order(const Ticket& t) override;
  void cancel_in_order(const Ticket& t) override;

  [[nodiscard]] std::size_t num_buckets() const noexcept override { return layout_.buckets().size(); }
  [[nodiscard]] std::vector<Slice> buckets() const override { return layout_.ranges(); }
  /// Milliseconds the last step's allreduces took on the communication thread (sum over buckets).
  [[nodiscard]] double last_comm_ms() const noexcept override { return last_comm_ms_; }
  [[nodiscard]] double last_exposed_ms() const noexcept override { return last_exposed_ms_; }

 private:
  void run();                                 // communication thread
  void reduce(std::size_t b, bool blocking);  // one bucket, on the calling thread
  /// The first bucket that is not complete (num_buckets() when all are). Under mu_.
  [[nodiscard]] std::size_t first_incomplete() const;

  Backend& backend_;
  std::span<float> grads_;
  BucketOptions opts_;
  BucketLayout layout_;  // and the step's arrivals, guarded by mu_

  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t reduced_ = 0;               // guarded by mu_: buckets [0, reduced_) are reduced this step
  std::exception_ptr error_;              // guarded by mu_
  bool stop_ = false;                     // guarded by mu_
  std::atomic<int> pending_{0};           // buckets complete but not yet taken by the communication thread
  std::atomic<bool> reduced_all_{false};  // reduced_ == buckets_.size(), readable without mu_
  bool busy_ = false;                     // guarded by mu_: the communication thread is inside a collective
  std::deque<Ticket> tasks_;              // guarded by mu_ (and their InOrder), in the order handed over
  double comm_ms_ = 0;                    // guarded by mu_
  double last_comm_ms_ = 0;
  double last_exposed_ms_ = 0;
  std::thread thread_;
};

}  // namespace sinew::comm
