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

/// PowerSGD (Vogels et al., 2019; lowrank.hpp): each gradient matrix worth compressing travels as two
/// rank-r factors, P = M Q and then Q = M^T P (P orthonormalised in between), each summed over the ranks
/// in one allreduce per bucket; vectors and small matrices go exactly, in the first of the two allreduces.
/// The allreduces are our ring's (deadline-bounded point-to-point, like ByteGrad's exchange). With the MPI
/// library's nonblocking allreduce, polled against the deadline, a step's two factor allreduces (50 KB for
/// the Fashion-MNIST MLP) took about 30 ms at 100 Mbit/s; with the ring about 5 (epoch 13.4 -> 6.3 s).
/// M is this rank's gradient plus its error-feedback memory, which keeps what the approximation missed:
/// e = M - P Q^T / n (the sum's approximation, shared by all ranks, less this rank's share), so that no
/// gradient mass is lost, only delayed. Q is kept from step to step (warm start). The first
/// `warmup_steps` steps reduce every bucket exactly, as PyTorch's start_powerSGD_iter.
///
/// Every rank ends with the same bytes (the factors come from the same allreduces), so the models stay
/// replicated. After a change of membership the object is rebuilt: the memories start at zero and Q from
/// its seed. The memories are per-rank state in checkpoints ("algo/powersgd_error").
class PowerSGD final : public Algorithm {
 public:
  PowerSGD(Context ctx, int rank, std::int64_t warmup_steps)
      : Algorithm(std::move(ctx)),
        warmup_(warmup_steps),
        factors_(lowrank_factors(ctx_.workload.views(), rank)),
        error_(grads_.size(), 0.f) {}
  [[nodiscard]] Kind kind() const override { return Kind::kPowerSgd; }
  void begin_step(std::int64_t s) override { step_ = s; }
  [[nodiscard]] bool reduces_gradients(std::int64_t) const override { return true; }
  void reduce_bucket(std::span<float> bucket, std::size_t offset) override {
    const int n = ctx_.backend.size();
    if (n == 1) return;
    if (step_ <= warmup_) {
      ring_sum(ring_, bucket, ctx_.op);
      return;
    }
    using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using Map = Eigen::Map<RowMajor>;
    const auto ix = [](std::size_t v) { return static_cast<Eigen::Index>(v); };
    const std::size_t end = offset + bucket.size();
    // The bucket's matrices (buckets hold whole layers) and, between them, the elements sent exactly.
    struct Run {
      std::size_t offset, count;  // within the bucket
    };
    std::vector<LowRankFactor*> mine;
    std::vector<Run> exact;
    std::size_t at = offset, p_floats = 0, q_floats = 0, exact_floats = 0;
    for (auto& f : factors_) {
      const std::size_t f_end = f.offset + f.rows * f.cols;
      if (f_end <= offset || f.offset >= end) continue;
      if (f.offset < offset || f_end > end) {
        SINEW_THROW(InvalidArgument,
                    "powersgd: the bucket [{}, {}) splits the matrix at [{}, {}); buckets must hold whole "
                    "layers",
                    offset, end, f.offset, f_end);
      }
      if (f.offset > at) exact.push_back({at - offset, f.offset - at});
      at = f_end;
      mine.push_back(&f);
      p_floats += f.rows * f.rank;
      q_floats += f.cols * f.rank;
    }
    if (at < end) exact.push_back({at - offset, end - at});
    for (const auto& e : exact) exact_floats += e.count;

    // The first allreduce: every P = M Q, then the exact elements.
    first_.resize(p_floats + exact_floats);
    second_.resize(q_floats);
    std::size_t p_at = 0;
    for (LowRankFactor* f : mine) {
      const std::size_t rows = f->rows, cols = f->cols, r = f->rank;
      float* g = grads_.data() + f->offset;
      const float* e = error_.data() + f->offset;
      for (std::size_t i = 0; i < rows * cols; ++i) g[i] += e[i];  // M = gradient + memory, in place
      Map(first_.data() + p_at, ix(rows), ix(r)).noalias() =
          Map(g, ix(rows), ix(cols)) * Map(f->q.data(), ix(cols), ix(r));
      p_at += rows * r;
    }
    std::size_t x_at = p_floats;
    for (const auto& e : exact) {
      std::copy_n(bucket.data() + e.offset, e.count, first_.data() + x_at);
      x_at += e.count;
    }
    ring_sum(ring_, first_, ctx_.op);
    x_at = p_floats;
    for (const auto& e : exact) {
      std::copy_n(first_.data() + x_at, e.count, bucket.data() + e.offset);
      x_at += e.count;
    }

    // The second: every Q = M^T P, with P's columns orthonormal.
    p_at = 0;
    std::size_t q_at = 0;
    for (LowRankFactor* f : mine) {
      const std::size_t rows = f->rows, cols = f->cols, r = f->rank;
      orthonormalize_columns(std::span<float>(first_).subspan(p_at, rows * r), rows, r);
      Map(second_.data() + q_at, ix(cols), ix(r)).noalias() =
          Map(grads_.data() + f->offset, ix(rows), ix(cols)).transpose() *
          Map(first_.data() + p_at, ix(rows), ix(r));
      p_at += rows * r;
      q_at += cols * r;
    }
    ring_sum(ring_, second_, ctx_.op);

    // The approximation of the sum, P Q^T, replaces the gradients; the memory keeps what this rank's M
    // lost against its share of it.
    p_at = 0;
    q_at = 0;
    const float share = 1.f / static_cast<float>(n);
    for (LowRankFactor* f : mine) {
      const std::size_t rows = f->rows, cols = f->cols, r = f->rank;
      float* g = grads_.data() + f->offset;
      float* e = error_.data() + f->offset;
      std::copy_n(second_.data() + q_at, cols * r, f->q.data());  // the warm start of the next step
      std::copy_n(g, rows * cols, e);
      Map(g, ix(rows), ix(cols)).noalias() =
          Map(first_.data() + p_at, ix(rows), ix(r)) * Map(f->q.data(), ix(cols), ix(r)).transpose();
      for (std::size_t i = 0; i < rows * cols; ++i) e[i] -= share * g[i];
      p_at += rows * r;
      q_at += cols * r;
    }
  }
  std::vector<std::pair<std::string, std::span<float>>> rank_state() override {
    return {{"algo/powersgd_error", std::span<float>(error_)}};
  }

 private:
  std::int64_t warmup_;
  std::int64_t step_ = 0;
  std::vector<LowRankFactor> factors_;
  std::vector<float> error_;           // error-feedback memory, this rank's; zero outside the matrices
  std::vector<float> first_, second_;  // one bucket's messages
  comm::ring::RingBackend ring_{ctx_.backend, &stats_};  // every allreduce, counting its bytes
};

}  // namespace

std::unique_ptr<Algorithm> make_powersgd(Context ctx, const AlgorithmOptions& o) {
  return std::make_unique<PowerSGD>(std::move(ctx), o.powersgd_rank, o.powersgd_warmup_steps);
}

}  // namespace sinew::algo::impl
