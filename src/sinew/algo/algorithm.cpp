#include "sinew/algo/algorithm.hpp"

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

#include "sinew/algo/lowrank.hpp"
#include "sinew/algo/quantize.hpp"
#include "sinew/comm/ring/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::algo {

namespace {

// Point-to-point tags of the model exchanges (the ring and compressed allreduces use the context's tag).
constexpr int kTagPeer = 101;     // shift_one: the whole model to this round's peer
constexpr int kTagToRight = 102;  // low_precision_decentralized: a compressed difference to the right
constexpr int kTagToLeft = 103;   // ... and to the left
constexpr int kTagAsync = 104;    // async: the background thread's ring allreduces

/// Bytes one rank sends in a bandwidth-optimal allreduce of `elements` floats over `n` ranks.
std::uint64_t allreduce_bytes(std::size_t elements, int n) {
  return n <= 1 ? 0
                : 2 * static_cast<std::uint64_t>(n - 1) * elements * sizeof(float) /
                      static_cast<std::uint64_t>(n);
}

/// Sends `out` to `to` and receives `in` from `from`, both with the context's deadline.
void exchange(comm::Backend& b, comm::Buffer out, int to, comm::Buffer in, int from, comm::Options o,
              int tag_out, int tag_in) {
  o.tag = tag_in;
  auto r = b.recv(in, from, o);
  o.tag = tag_out;
  auto s = b.send(out, to, o);
  r->wait(o.timeout);
  s->wait(o.timeout);
}

/// Local gradients as a rank's own mean: the trainer divides each rank's loss by the step's global sample
/// count, so that summed gradients are the global mean; algorithms that step on local gradients scale back.
void scale(std::span<float> v, float f) {
  for (auto& x : v) x *= f;
}

// ---- exact and compressed gradient reduction ---------------------------------------------------------

/// Sums a buffer over the group in place with our ring (comm/ring/), bounded by `op`'s deadline.
void ring_sum(comm::ring::RingBackend& ring, std::span<float> v, const comm::Options& op) {
  ring.allreduce_sync(comm::Buffer::of(v), comm::ReduceOp::kSum, op);
}

/// The baseline: every gradient bucket is summed exactly, with the MPI library's tuned allreduce (the
/// bucketer's own path) or with our ring over point-to-point (faster on slow TCP links, see FACTS.md).
class GradientAllreduce final : public Algorithm {
 public:
  GradientAllreduce(Context ctx, AllreduceImpl impl) : Algorithm(std::move(ctx)), impl_(impl) {}
  [[nodiscard]] Kind kind() const override { return Kind::kGradientAllreduce; }
  [[nodiscard]] bool reduces_gradients(std::int64_t) const override { return true; }
  [[nodiscard]] bool uses_backend_allreduce() const override { return impl_ == AllreduceImpl::kMpi; }
  void reduce_bucket(std::span<float> bucket, std::size_t) override { ring_sum(ring_, bucket, ctx_.op); }
  void step(std::int64_t s, float lr) override {
    if (impl_ == AllreduceImpl::kMpi)
      stats_.bytes_sent += allreduce_bytes(grads_.size(), ctx_.backend.size());
    Algorithm::step(s, lr);
  }

 private:
  AllreduceImpl impl_;
  comm::ring::RingBackend ring_{ctx_.backend, &stats_};  // kRing: reduces the buckets, counting its bytes
};

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

// ---- decentralized model averaging ---------------------------------------------------------------------

/// The algorithms that step on each rank's own gradients and exchange models instead: no gradient
/// reduction, and the optimiser step scales the gradients from this rank's share of the global mean back
/// to its own mean.
class LocalSteps : public Algorithm {
 public:
  [[nodiscard]] bool reduces_gradients(std::int64_t) const final { return false; }
  [[nodiscard]] bool lockstep() const final { return false; }
  void reduce_bucket(std::span<float>, std::size_t) final {}
  void step(std::int64_t s, float lr) final {
    scale(grads_, static_cast<float>(ctx_.backend.size()));
    Algorithm::step(s, lr);
  }

 protected:
  using Algorithm::Algorithm;
};

/// Local steps on local gradients; every `interval` steps each rank averages its model with all others
/// (allreduce) or with one peer that changes every round (shift_one: a perfect matching, so a pairwise
/// exchange of whole models).
class Decentralized final : public LocalSteps {
 public:
  Decentralized(Context ctx, bool shift_one, int interval)
      : LocalSteps(std::move(ctx)), shift_one_(shift_one), interval_(interval), peer_(params_.size()) {}
  [[nodiscard]] Kind kind() const override { return Kind::kDecentralized; }
  void after_step(std::int64_t s) override {
    const int n = ctx_.backend.size();
    if (n == 1 || s % interval_ != 0) return;
    const std::span<float> p = params_;
    if (!shift_one_) {
      ctx_.backend.allreduce_sync(comm::Buffer::of(p), comm::ReduceOp::kSum, ctx_.op);
      scale(p, 1.f / static_cast<float>(n));
      stats_.bytes_sent += allreduce_bytes(p.size(), n);
      return;
    }
    const int peer = shift_one_peer(ctx_.backend.rank(), n, s / interval_);
    if (peer < 0) return;  // odd group size: this rank sits this round out
    exchange(ctx_.backend, comm::Buffer::of(p), peer, comm::Buffer::of(std::span<float>(peer_)), peer,
             ctx_.op, kTagPeer, kTagPeer);
    stats_.bytes_sent += p.size_bytes();
    for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.5f * (p[i] + peer_[i]);
  }
  void consensus() override { average_state(); }

 private:
  bool shift_one_;
  int interval_;
  std::vector<float> peer_;
};

/// Bagua's low-precision decentralized algorithm, in the form of CHOCO-SGD (Koloskova et al., 2019): ranks
/// on a ring keep estimates x̂ of their own and their two neighbours' models; each step a rank sends the
/// 8-bit quantised difference between its model and its own estimate to both neighbours (everyone
/// updates the same estimates from the same bytes), then moves towards the neighbours' estimates with
/// weights 1/3. The estimates start from an exact exchange and are rebuilt after every consensus.
class LowPrecisionDecentralized final : public LocalSteps {
 public:
  LowPrecisionDecentralized(Context ctx, std::size_t chunk, int interval)
      : LocalSteps(std::move(ctx)),
        chunk_(chunk),
        interval_(interval),
        self_(params_.size()),
        left_(params_.size()),
        right_(params_.size()),
        diff_(params_.size()) {
    reset();
  }
  [[nodiscard]] Kind kind() const override { return Kind::kLowPrecisionDecentralized; }
  void after_step(std::int64_t s) override {
    const int n = ctx_.backend.size();
    if (n == 1 || s % interval_ != 0) return;
    const std::span<float> x = params_;
    for (std::size_t i = 0; i < x.size(); ++i) diff_[i] = x[i] - self_[i];
    const std::size_t bytes = encoded_bytes(x.size(), chunk_);
    out_.resize(bytes);
    in_left_.resize(bytes);
    in_right_.resize(bytes);
    encode(diff_, chunk_, out_);
    const int r = ctx_.backend.rank(), left = (r + n - 1) % n, right = (r + 1) % n;
    auto bytes_of = [](std::vector<std::byte>& v) { return comm::Buffer::of(std::span<std::byte>(v)); };
    comm::Options o = ctx_.op;
    o.tag = kTagToRight;  // what the left neighbour sent to its right is for me, and so on
    auto rl = ctx_.backend.recv(bytes_of(in_left_), left, o);
    auto sr = ctx_.backend.send(bytes_of(out_), right, o);
    o.tag = kTagToLeft;
    auto rr = ctx_.backend.recv(bytes_of(in_right_), right, o);
    auto sl = ctx_.backend.send(bytes_of(out_), left, o);
    for (auto* w : {rl.get(), sr.get(), rr.get(), sl.get()}) w->wait(o.timeout);
    stats_.bytes_sent += 2 * bytes;
    decode_add(out_, chunk_, self_);
    decode_add(in_left_, chunk_, left_);
    decode_add(in_right_, chunk_, right_);
    constexpr float kThird = 1.f / 3.f;
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += kThird * (left_[i] + right_[i] - 2.f * self_[i]);
  }
  void consensus() override {
    average_state();
    // Every rank now holds the same model, bit for bit, so the neighbours' estimates are known without
    // the two exchanges of reset().
    std::copy(params_.begin(), params_.end(), self_.begin());
    std::copy(params_.begin(), params_.end(), left_.begin());
    std::copy(params_.begin(), params_.end(), right_.begin());
  }
  /// Exact estimates: a full-precision exchange with both neighbours.
  void reset() override {
    const int n = ctx_.backend.size();
    std::copy(params_.begin(), params_.end(), self_.begin());
    if (n == 1) return;
    const int r = ctx_.backend.rank(), left = (r + n - 1) % n, right = (r + 1) % n;
    const auto p = comm::Buffer::of(std::span<float>(self_));
    exchange(ctx_.backend, p, right, comm::Buffer::of(std::span<float>(left_)), left, ctx_.op, kTagToRight,
             kTagToRight);
    exchange(ctx_.backend, p, left, comm::Buffer::of(std::span<float>(right_)), right, ctx_.op, kTagToLeft,
             kTagToLeft);
    stats_.bytes_sent += 2 * p.bytes();
  }

 private:
  std::size_t chunk_;
  int interval_;
  std::vector<float> self_, left_, right_, diff_;
  std::vector<std::byte> out_, in_left_, in_right_;
};

// ---- asynchronous model averaging ----------------------------------------------------------------------

/// Local steps on local gradients while a background thread averages the models every `interval_ms`, with
/// our ring allreduce over the group's point-to-point messages under a tag of its own (no second
/// communicator: creating one next to the group's rebuilds after a failure made MPI_Comm_dup fail): the
/// training thread hands it a copy of the parameters after a step, the thread averages the copies of all
/// ranks, and the training thread adds (average - copy) after a later step, so the steps taken meanwhile are
/// kept. Only the training thread touches the parameters.
///
/// Stopping is agreed: every round starts with a tiny allreduce of a stop flag, and all threads leave in
/// the first round where any rank asked to stop, so no thread is left waiting in a collective. A failed
/// round (a dead peer) ends the thread; the training thread then raises CommFailure at its next step.
class Async final : public LocalSteps {
 public:
  Async(Context ctx, int interval_ms)
      : LocalSteps(std::move(ctx)), interval_(interval_ms), sent_(params_.size()), avg_(params_.size()) {
    op_.tag = kTagAsync;
  }
  Async(const Async&) = delete;
  Async& operator=(const Async&) = delete;
  Async(Async&&) = delete;
  Async& operator=(Async&&) = delete;
  ~Async() override {
    // A planned change (every rank gets here): the agreed last round ends the threads. After a failure
    // the trainer has aborted the backend (ULFM revoke), so a round in progress fails at once; without
    // ULFM the round's deadline bounds the join.
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (!thread_.joinable()) return;
    thread_.join();
  }
  [[nodiscard]] Kind kind() const override { return Kind::kAsync; }
  void after_step(std::int64_t) override {
    // The thread starts with the first step over this group, so that it never runs next to the
    // collectives that build the group (connect, synchronise, a spawn).
    if (!thread_.joinable()) start();
    stats_.bytes_sent += bg_bytes_.exchange(0);
    std::unique_lock lock(mu_);
    if (error_) {
      auto e = error_;
      lock.unlock();
      std::rethrow_exception(e);
    }
    if (state_ == State::kReduced) {
      const std::span<float> p = params_;
      for (std::size_t i = 0; i < p.size(); ++i) p[i] += avg_[i] - sent_[i];
      state_ = State::kIdle;
    } else if (state_ == State::kWantCopy) {
      std::copy(params_.begin(), params_.end(), sent_.begin());
      state_ = State::kCopied;
    } else {
      return;
    }
    lock.unlock();
    cv_.notify_all();
  }
  /// Stops the thread (an agreed last round) and averages exactly; the next step starts it again.
  void consensus() override {
    stop_and_join();
    average_state();
  }
  void reset() override { stop_and_join(); }

 private:
  enum class State { kIdle, kWantCopy, kCopied, kReduced };

  void start() {
    state_ = State::kIdle;
    stop_ = false;
    thread_ = std::thread([this] { run(); });
  }

  void stop_and_join() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    std::lock_guard lock(mu_);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  void run() {
    const auto n = static_cast<float>(ctx_.backend.size());
    try {
      for (;;) {
        float stop = 0;  // summed: > 0 when any rank asked to stop
        {
          std::unique_lock lock(mu_);
          cv_.wait_for(lock, std::chrono::milliseconds(interval_), [&] { return stop_; });
          // The previous average must be applied before the next copy is taken.
          cv_.wait(lock, [&] { return stop_ || state_ == State::kIdle; });
          if (!stop_) {
            state_ = State::kWantCopy;
            cv_.wait(lock, [&] { return stop_ || state_ == State::kCopied; });
          }
          stop = stop_ ? 1.f : 0.f;
        }
        ring_sum(ring_, std::span<float>(&stop, 1), op_);
        if (stop > 0.f) break;
        std::copy(sent_.begin(), sent_.end(), avg_.begin());
        ring_sum(ring_, avg_, op_);
        scale(avg_, 1.f / n);
        bg_bytes_ += allreduce_bytes(avg_.size(), ctx_.backend.size()) + sizeof stop;
        std::lock_guard lock(mu_);
        state_ = State::kReduced;
      }
    } catch (...) {
      std::lock_guard lock(mu_);
      error_ = std::current_exception();
    }
  }

  int interval_;
  std::vector<float> sent_, avg_;
  comm::Options op_ = ctx_.op;                  // the background rounds' tag
  comm::ring::RingBackend ring_{ctx_.backend};  // the background rounds (counted in bg_bytes_)
  std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kIdle;  // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::exception_ptr error_;    // guarded by mu_
  std::atomic<std::uint64_t> bg_bytes_{0};
  std::thread thread_;
};

// ---- auto ----------------------------------------------------------------------------------------------

std::unique_ptr<Algorithm> make_named(Kind kind, const AlgorithmOptions& o, Context ctx) {
  switch (kind) {
    case Kind::kGradientAllreduce:
      return std::make_unique<GradientAllreduce>(std::move(ctx), o.allreduce);
    case Kind::kByteGrad:
      return std::make_unique<ByteGrad>(std::move(ctx), o.chunk, o.error_feedback, o.bits);
    case Kind::kPowerSgd:
      return std::make_unique<PowerSGD>(std::move(ctx), o.powersgd_rank, o.powersgd_warmup_steps);
    case Kind::kQAdam:
      return std::make_unique<QAdam>(std::move(ctx), o);
    case Kind::kDecentralized:
      return std::make_unique<Decentralized>(std::move(ctx), o.peer_selection == "shift_one",
                                             o.comm_interval);
    case Kind::kLowPrecisionDecentralized:
      return std::make_unique<LowPrecisionDecentralized>(std::move(ctx), o.chunk, o.comm_interval);
    case Kind::kAsync:
      return std::make_unique<Async>(std::move(ctx), o.sync_interval_ms);
    case Kind::kAuto:
      break;
  }
  SINEW_THROW(InternalError, "make_named: {} is not a concrete algorithm", name_of(kAlgorithmNames, kind));
}

/// `auto`: times our ring allreduce of a buffer as large as the gradients against one step's computation
/// (both the slowest rank's), and picks the exact allreduce (our ring) when communication costs at most
/// half the compute; otherwise ByteGrad with error feedback (a quarter of the bytes, gradients exact on
/// average) when its share of the bytes brings communication down to half the compute; otherwise, when
/// communication dominates even at 8 bits, PowerSGD, if the model's matrices make it send fewer bytes
/// than ByteGrad. On the shaped test bed ByteGrad and PowerSGD beat the decentralized algorithms at every
/// rate (docs/benchmarks.md), so those are not candidates.
std::unique_ptr<Algorithm> make_auto(AlgorithmOptions o, Context ctx) {
  const int n = ctx.backend.size();
  Kind choice = Kind::kGradientAllreduce;
  std::string why;
  double t[2] = {0, 0};  // allreduce ms, compute ms: the slowest rank's
  if (n == 1) {
    why = "a single rank communicates nothing";
  } else {
    // The ring's time grows with the bytes: a probe of at most 8 MiB, scaled to the gradients' size, costs
    // 4 x 8 MiB instead of 4 x the model (VGG-16 at 100 Mbit/s: ~4 s instead of ~40 s before the first step).
    const std::size_t total_floats = ctx.workload.grads().size();
    constexpr std::size_t kProbeFloats = std::size_t{1} << 21;
    std::vector<float> probe(std::min(total_floats, kProbeFloats), 1.f);
    comm::ring::RingBackend ring(ctx.backend);
    ring_sum(ring, probe, ctx.op);  // warm-up: connections, pages
    std::vector<double> ms;
    for (int i = 0; i < 3; ++i) {
      const auto t0 = Clock::now();
      ring_sum(ring, probe, ctx.op);
      ms.push_back(seconds_since(t0) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    t[0] = ms[1] * static_cast<double>(total_floats) /
           static_cast<double>(std::max<std::size_t>(probe.size(), 1));
    t[1] = ctx.compute_ms();
    ctx.backend.allreduce_sync(comm::Buffer::of(std::span<double>(t)), comm::ReduceOp::kMax, ctx.op);
    const double ratio = t[0] / std::max(t[1], 1e-3);
    constexpr double kExactBelow = 0.5;  // allreduce at most half a step's compute: keep it exact
    if (ratio <= kExactBelow) {
      why = fmt::format("allreduce {:.1f} ms <= {:.1f} x compute {:.1f} ms", t[0], kExactBelow, t[1]);
    } else {
      // The shares of the exact allreduce's bytes that ByteGrad and PowerSGD send.
      const auto total = static_cast<double>(ctx.workload.grads().size());
      const double bytegrad = (1.0 + 2.0 * sizeof(float) / static_cast<double>(o.chunk)) / sizeof(float);
      const double lowrank =
          static_cast<double>(powersgd_floats(lowrank_factors(ctx.workload.views(), o.powersgd_rank),
                                              ctx.workload.grads().size())) /
          total;
      if (ratio * bytegrad <= kExactBelow || lowrank >= bytegrad) {
        choice = Kind::kByteGrad;
        o.error_feedback = true;
        why = fmt::format("allreduce {:.1f} ms is {:.1f} x compute {:.1f} ms: 8-bit gradients", t[0], ratio,
                          t[1]);
      } else {
        choice = Kind::kPowerSgd;
        why = fmt::format(
            "allreduce {:.1f} ms is {:.1f} x compute {:.1f} ms, {:.1f} x at 8 bits: rank-{} gradients, "
            "{:.1f} % "
            "of the bytes",
            t[0], ratio, t[1], ratio * bytegrad, o.powersgd_rank, 100 * lowrank);
      }
    }
    o.allreduce = AllreduceImpl::kRing;
  }
  const double busbw =
      t[0] > 0 ? static_cast<double>(allreduce_bytes(ctx.workload.grads().size(), n)) / (t[0] / 1e3) : 0;
  if (ctx.event) {
    ctx.event({{"event", "algorithm"},
               {"chosen", std::string(name_of(kAlgorithmNames, choice))},
               {"reason", why},
               {"world_size", n},
               {"allreduce_ms", t[0]},
               {"compute_ms", t[1]},
               {"bus_bandwidth_mbit_s", busbw * 8 / 1e6}});
  }
  return make_named(choice, o, std::move(ctx));
}

}  // namespace

void Algorithm::step(std::int64_t, float lr) { ctx_.workload.optimizer_step(lr); }

void Algorithm::after_step(std::int64_t) {}

void Algorithm::average_state() {
  const int n = ctx_.backend.size();
  if (n == 1) return;
  // Our ring, not the MPI library's allreduce: bounded by the deadline, bitwise-equal results on every
  // rank, and faster on slow links (a transformer's 92 MB of parameters and momentum at 100 Mbit/s: 77 s
  // with Open MPI's allreduce, see docs/benchmarks.md).
  comm::ring::RingBackend ring(ctx_.backend, &stats_);
  auto average = [&](std::span<float> v) {
    ring_sum(ring, v, ctx_.op);
    scale(v, 1.f / static_cast<float>(n));
  };
  average(params_);
  for (auto& [name, buf] : ctx_.workload.optimizer_state()) average(buf);
}

std::unique_ptr<Algorithm> make_algorithm(const AlgorithmOptions& opts, Context ctx) {
  if (opts.kind == Kind::kAuto) return make_auto(opts, std::move(ctx));
  return make_named(opts.kind, opts, std::move(ctx));
}

int shift_one_peer(int rank, int size, std::int64_t round) {
  SINEW_ENFORCE(size >= 1 && rank >= 0 && rank < size, "shift_one_peer: rank {} of {}", rank, size);
  // Circle method: with an even count m, rank m-1 stays put and the others rotate; in round k, rank k
  // meets m-1 and any other pair (a, b) meets when a + b == 2k (mod m-1). An odd size adds a phantom
  // rank m-1 = size, whose partner sits out.
  const int m = size % 2 == 0 ? size : size + 1;
  if (m == 2) return size == 2 ? 1 - rank : -1;
  const auto k = static_cast<int>(round % (m - 1));
  int peer = 0;
  if (rank == m - 1) {
    peer = k;
  } else if (rank == k) {
    peer = m - 1;
  } else {
    peer = ((2 * k - rank) % (m - 1) + (m - 1)) % (m - 1);
  }
  return peer < size ? peer : -1;
}

}  // namespace sinew::algo
