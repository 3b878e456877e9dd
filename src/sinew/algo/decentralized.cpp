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

}  // namespace

std::unique_ptr<Algorithm> make_decentralized(Context ctx, const AlgorithmOptions& o) {
  return std::make_unique<Decentralized>(std::move(ctx), o.peer_selection == "shift_one", o.comm_interval);
}

}  // namespace sinew::algo::impl
