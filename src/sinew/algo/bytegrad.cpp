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

/// Bagua's ByteGrad: buckets are reduced in 8-bit min-max quantised form (compressed_allreduce), about a
/// quarter of the bytes; at 4 or 2 bits an eighth or a sixteenth. With error feedback (which Bagua lacks)
/// the quantisation error of each step is added to the next step's gradients, so no gradient mass is
/// lost, only delayed.
class ByteGrad final : public Algorithm {
 public:
  ByteGrad(Context ctx, std::size_t chunk, bool error_feedback, int bits)
      : Algorithm(std::move(ctx)),
        chunk_(chunk),
        bits_(bits),
        residual_(error_feedback ? grads_.size() : 0, 0.f) {}
  [[nodiscard]] Kind kind() const override { return Kind::kByteGrad; }
  [[nodiscard]] bool reduces_gradients(std::int64_t) const override { return true; }
  void reduce_bucket(std::span<float> bucket, std::size_t offset) override {
    std::span<float> res;
    if (!residual_.empty()) res = std::span<float>(residual_).subspan(offset, bucket.size());
    if (ctx_.scatter_bucket) {
      // Sharded gradients: the same quantised exchange, each shard's part reduced by its owner and sent
      // to its holders only (counted by the shards).
      const Quantization q{chunk_, bits_, res};
      ctx_.scatter_bucket(ctx_.backend, bucket, offset, &q);
      return;
    }
    compressed_allreduce(ctx_.backend, bucket, chunk_, res, ctx_.op, &stats_, bits_);
  }
  std::vector<std::pair<std::string, std::span<float>>> rank_state() override {
    if (residual_.empty()) return {};
    return {{"algo/residual", std::span<float>(residual_)}};
  }

 private:
  std::size_t chunk_;
  int bits_;
  std::vector<float> residual_;
};

}  // namespace

std::unique_ptr<Algorithm> make_bytegrad(Context ctx, const AlgorithmOptions& o) {
  return std::make_unique<ByteGrad>(std::move(ctx), o.chunk, o.error_feedback, o.bits);
}

}  // namespace sinew::algo::impl
