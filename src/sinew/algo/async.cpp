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

}  // namespace

std::unique_ptr<Algorithm> make_async(Context ctx, const AlgorithmOptions& o) {
  return std::make_unique<Async>(std::move(ctx), o.sync_interval_ms);
}

}  // namespace sinew::algo::impl
