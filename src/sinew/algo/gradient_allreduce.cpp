#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <Eigen/Core>

#include "sinew/algo/impl.hpp"
#include "sinew/algo/lowrank.hpp"
#include "sinew/algo/quantize.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::algo::impl {

namespace {

/// The baseline: every gradient bucket is summed exactly, with the MPI library's tuned allreduce (the
/// bucketer's own path) or with our ring over point-to-point (faster on slow TCP links, see FACTS.md); with
/// sharded gradients (--shard gradients) reduce-scattered to the shards' holders instead.
class GradientAllreduce final : public Algorithm {
 public:
  GradientAllreduce(Context ctx, AllreduceImpl impl) : Algorithm(std::move(ctx)), impl_(impl) {}
  [[nodiscard]] Kind kind() const override { return Kind::kGradientAllreduce; }
  [[nodiscard]] bool reduces_gradients(std::int64_t) const override { return true; }
  [[nodiscard]] bool uses_backend_allreduce() const override {
    return impl_ == AllreduceImpl::kMpi && !ctx_.scatter_bucket;
  }
  void reduce_bucket(std::span<float> bucket, std::size_t offset) override {
    if (ctx_.scatter_bucket) {
      ctx_.scatter_bucket(ctx_.backend, bucket, offset, nullptr);  // sharded gradients: counted by the shards
    } else {
      ring_sum(ring_, bucket, ctx_.op);
    }
  }
  void step(std::int64_t s, float lr) override {
    if (impl_ == AllreduceImpl::kMpi && !ctx_.scatter_bucket)
      stats_.bytes_sent += allreduce_bytes(grads_.size(), ctx_.backend.size());
    Algorithm::step(s, lr);
  }

 private:
  AllreduceImpl impl_;
  comm::ring::RingBackend ring_{ctx_.backend, &stats_};  // kRing: reduces the buckets, counting its bytes
};

}  // namespace

std::unique_ptr<Algorithm> make_gradient_allreduce(Context ctx, AllreduceImpl impl) {
  return std::make_unique<GradientAllreduce>(std::move(ctx), impl);
}

}  // namespace sinew::algo::impl
