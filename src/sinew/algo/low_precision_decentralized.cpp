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

}  // namespace

std::unique_ptr<Algorithm> make_low_precision_decentralized(Context ctx, const AlgorithmOptions& o) {
  return std::make_unique<LowPrecisionDecentralized>(std::move(ctx), o.chunk, o.comm_interval);
}

}  // namespace sinew::algo::impl
