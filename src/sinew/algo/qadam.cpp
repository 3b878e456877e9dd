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

/// QAdam (Bagua): exact Adam for the warm-up steps; then the second moment is frozen and the ranks
/// exchange their local first moments, quantised, instead of gradients. Momentum is smoother than a
/// gradient and quantises with less relative error. Either exchange runs bucket by bucket as backward
/// produces the gradients (a bucket's momentum needs only its own gradients), overlapped with the rest
/// of backward like the exact allreduce.
class QAdam final : public Algorithm {
 public:
  QAdam(Context ctx, const AlgorithmOptions& o)
      : Algorithm(std::move(ctx)),
        o_(o),
        m_(ctx_.workload.optimizer_state("adam_m", "--algorithm qadam (Adam's first moment)")),
        v_(ctx_.workload.optimizer_state("adam_v", "--algorithm qadam (Adam's second moment)")),
        local_(params_.size()) {}
  [[nodiscard]] Kind kind() const override { return Kind::kQAdam; }
  void begin_step(std::int64_t s) override { step_ = s; }
  [[nodiscard]] bool reduces_gradients(std::int64_t) const override { return true; }
  void reduce_bucket(std::span<float> bucket, std::size_t offset) override {
    if (warm_up(step_)) {
      ring_sum(ring_, bucket, ctx_.op);
      return;
    }
    // This rank's momentum from its own gradients (its share times n is its own mean gradient); the
    // average of the ranks' momenta is the momentum of the global mean gradient.
    const auto n = static_cast<float>(ctx_.backend.size());
    const float b1 = o_.beta1;
    const std::span<float> local = std::span<float>(local_).subspan(offset, bucket.size());
    const float* m = m_.data() + offset;
    for (std::size_t i = 0; i < bucket.size(); ++i) local[i] = b1 * m[i] + (1.f - b1) * n * bucket[i];
    compressed_allreduce(ctx_.backend, local, o_.chunk, {}, ctx_.op, &stats_);
    exchanged_ = step_;
  }
  void step(std::int64_t s, float lr) override {
    if (warm_up(s)) {
      Algorithm::step(s, lr);
      return;
    }
    SINEW_ENFORCE(exchanged_ == s, "qadam: step {} without its momentum exchange (begin_step {})", s, step_);
    if (!floored_) floor_variance();
    const auto n = static_cast<float>(ctx_.backend.size());
    const std::span<float> p = params_;
    const std::int64_t t = ctx_.workload.optimizer_steps() + 1;
    const std::int64_t tv = std::min<std::int64_t>(t, std::max<std::int64_t>(o_.qadam_warmup_steps, 1));
    const double bc1 = 1.0 - std::pow(static_cast<double>(o_.beta1), static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(static_cast<double>(o_.beta2), static_cast<double>(tv));  // frozen v
    const auto step_size = static_cast<float>(lr / bc1);
    const auto inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    for (std::size_t i = 0; i < p.size(); ++i) {
      m_[i] = local_[i] / n;
      p[i] -= step_size * m_[i] / (std::sqrt(v_[i]) * inv_sqrt_bc2 + o_.eps);
    }
    ctx_.workload.set_optimizer_steps(t);
  }

 private:
  [[nodiscard]] bool warm_up(std::int64_t s) const { return s <= o_.qadam_warmup_steps; }

  /// A coordinate whose gradient was zero in every warm-up step (a ReLU unit dead at initialisation: 30 %
  /// of VGG-16's after 2 steps) would have a frozen variance of 0, and any later momentum, a revived unit's
  /// or the quantiser's rounding, would move it by lr * m / eps: the model went to NaN within 5 steps. Such a
  /// coordinate takes the mean variance of its tensor's others (of all others when its whole tensor saw
  /// nothing), so that its steps are the size of its neighbours'. Every rank holds the same variance, so
  /// every rank floors alike; idempotent, so a rebuilt object (after a change of membership, a resume)
  /// may do it again.
  void floor_variance() {
    floored_ = true;
    auto mean_nonzero = [](std::span<const float> v) {
      double sum = 0;
      std::size_t k = 0;
      for (const float x : v) {
        if (x > 0.f) {
          sum += x;
          ++k;
        }
      }
      return k > 0 ? static_cast<float>(sum / static_cast<double>(k)) : 0.f;
    };
    const float overall = mean_nonzero(v_);
    if (overall == 0.f) return;  // nothing had a gradient: nothing to scale by
    for (const TensorView& t : ctx_.workload.views()) {
      if (t.tensor != "params" || t.offset + t.count() > v_.size()) continue;
      const std::span<float> v = v_.subspan(t.offset, t.count());
      const float own = mean_nonzero(v);
      for (float& x : v) {
        if (x <= 0.f) x = own > 0.f ? own : overall;
      }
    }
    for (float& x : v_) {  // coordinates no view covers
      if (x <= 0.f) x = overall;
    }
  }

  AlgorithmOptions o_;
  std::span<float> m_, v_;
  std::vector<float> local_;  // the momenta being averaged (after the warm-up)
  std::int64_t step_ = 0, exchanged_ = 0;
  bool floored_ = false;
  comm::ring::RingBackend ring_{ctx_.backend, &stats_};  // the warm-up's exact gradient reduction
};

}  // namespace

std::unique_ptr<Algorithm> make_qadam(Context ctx, const AlgorithmOptions& o) {
  return std::make_unique<QAdam>(std::move(ctx), o);
}

}  // namespace sinew::algo::impl
