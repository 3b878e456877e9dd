// Gradient bucketing with overlap on the GPU: the counterpart of comm::GradientBucketer for gradients in
// device memory, reduced by the NCCL backend.
//
// The layout is the CPU bucketer's: ranges in the order backward produces them (last layer first),
// consecutive adjacent ranges merged into contiguous buckets of about `bucket_bytes`, each reduced in place.
// The overlap is the GPU's own: backward reports each range with a CUDA event recorded after the kernels
// that wrote it; the communication stream waits for that event on the GPU (cudaStreamWaitEvent, the host
// never blocks), and when a bucket's last range arrives its reduction is enqueued at once, in bucket order
// on every rank, so backward's kernels and the reductions of finished buckets run together. finish() then
// polls the reductions against the deadline, NCCL's async error and the MPI view's failure state.
//
// After a CommFailure or Timeout the NCCL backend is aborted: build a new bucketer over the rebuilt backend.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/comm/bucketer.hpp"
#include "sinew/comm/nccl/backend.hpp"

namespace sinew::comm::nccl {

struct DeviceBucketOptions {
  std::size_t bucket_bytes = 4u << 20;  ///< target bucket size; a range larger than this is a bucket alone
  Options op;                           ///< deadline of finish()
  /// Replaces the allreduce of a bucket: enqueues the in-place sum over ranks of `count` device floats at
  /// `data` (at `offset` in the gradients) on the backend's stream and returns a Work that completes with it
  /// (e.g. ByteGrad::reduce, bytegrad.hpp). Called on the thread of mark_ready(); it must not block.
  std::function<std::unique_ptr<Work>(float* data, std::size_t count, std::size_t offset)> reduce;
};

class DeviceBucketer final : public Bucketer {
 public:
  /// `grads`: n device floats. `ready_order`: as for comm::GradientBucketer, the ranges in the order
  /// backward reports them, covering the gradients exactly once, consecutive ones adjacent.
  DeviceBucketer(NcclBackend& nccl, float* grads, std::size_t n, const std::vector<Slice>& ready_order,
                 DeviceBucketOptions opts);
  DeviceBucketer(const DeviceBucketer&) = delete;
  DeviceBucketer& operator=(const DeviceBucketer&) = delete;
  DeviceBucketer(DeviceBucketer&&) = delete;
  DeviceBucketer& operator=(DeviceBucketer&&) = delete;
  ~DeviceBucketer() override = default;

  using Bucketer::mark_ready;

  /// The gradients of `r` (one entry of ready_order) are final once `ready` completes (null: already
  /// final). The communication stream waits for `ready` from now on (the event may be recorded again
  /// afterwards); when this completes a bucket, it and every complete bucket after it are enqueued, in
  /// bucket order. Never blocks the host. Throws CommFailure if enqueueing fails (the backend is aborted).
  void mark_ready(Slice r, cudaEvent_t ready) override;
  /// Polls every bucket's reduction to completion against opts.op.timeout, NCCL's async error and the MPI
  /// view's failure state, then re-arms for the next step. Throws CommFailure, or Timeout past the
  /// deadline, after aborting the backend. Every range must have been marked ready.
  void finish() override;

  [[nodiscard]] std::size_t num_buckets() const noexcept override { return layout_.buckets().size(); }
  [[nodiscard]] std::vector<Slice> buckets() const override { return layout_.ranges(); }
  /// Milliseconds from the first bucket's enqueue to the last one's completion as finish() saw it: the
  /// span of the step's communication (the GPU's own time is not observable without timing events).
  [[nodiscard]] double last_comm_ms() const noexcept override { return last_comm_ms_; }
  /// Milliseconds finish() blocked: communication not hidden behind backward.
  [[nodiscard]] double last_exposed_ms() const noexcept override { return last_exposed_ms_; }

 private:
  void enqueue_ready();
  void rearm();

  NcclBackend& nccl_;
  float* grads_;
  DeviceBucketOptions opts_;
  BucketLayout layout_;                       // and the step's arrivals
  std::vector<std::unique_ptr<Work>> works_;  // bucket b's reduction at [b]
  std::chrono::steady_clock::time_point first_enqueue_{};
  double last_comm_ms_ = 0;
  double last_exposed_ms_ = 0;
};

}  // namespace sinew::comm::nccl
