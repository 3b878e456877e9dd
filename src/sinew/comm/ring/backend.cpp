#include "sinew/comm/ring/backend.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <span>
#include <vector>

#include "sinew/core/error.hpp"

namespace sinew::comm::ring {
namespace {

using Works = std::vector<std::unique_ptr<Work>>;

int wrap(int i, int n) { return ((i % n) + n) % n; }

/// An operation that had nothing to do (one rank, no elements).
class CompletedWork final : public Work {
 public:
  bool test() override {
    if (aborted_.load(std::memory_order_acquire)) SINEW_THROW(CommFailure, "ring allreduce was aborted");
    return true;
  }
  void wait(std::chrono::milliseconds) override { test(); }
  void abort() noexcept override { aborted_.store(true, std::memory_order_release); }

 private:
  std::atomic<bool> aborted_{false};
};

/// One ring allreduce in flight: a state machine that test() advances. Steps 0..n-2 reduce-scatter,
/// n-1..2n-3 allgather. In both, step g sends block r-g, which this rank completed in step g-1 (or holds
/// from the start), and receives block r-g-1 from the left: added to ours during the reduce-scatter,
/// after which this rank holds the full sum of block r+1; copied during the allgather.
///
/// A mutex serialises test() (one thread drives the ring) and abort() (any thread); the flag lets a
/// waiting thread see the abort without the mutex.
class RingWork final : public Work {
 public:
  RingWork(RingBackend& owner, std::span<float> data, const Options& opts, CommStats* stats)
      : owner_(owner),
        data_(data),
        opts_(opts),
        stats_(stats),
        n_(owner.size()),
        r_(owner.rank()),
        what_(fmt::format("ring allreduce of {} floats", data.size())),
        incoming_(block_of(data.size(), n_, 0).count) {  // block 0 is a largest one
    post_step();
  }

  bool test() override {
    check_not_aborted();
    std::lock_guard lock(mu_);
    check_not_aborted();
    while (g_ < steps()) {
      const bool reduce = g_ < n_ - 1;
      const Block in = block_of(data_.size(), n_, wrap(r_ - g_ - 1, n_));
      // Adding segment i overlaps with the transfer of the later ones; they are added in order.
      for (; next_ < recvs_.size(); ++next_) {
        if (!recvs_[next_]->test()) return false;
        ++progress_;
        if (!reduce) continue;
        const std::size_t off = next_ * kSegment, len = std::min(kSegment, in.count - off);
        float* acc = data_.data() + in.offset + off;
        const float* add = incoming_.data() + off;
        for (std::size_t j = 0; j < len; ++j) acc[j] += add[j];
      }
      // The block sent now is written again n-1 steps later (the very next step with 2 ranks), and
      // `incoming_` is reused: MPI forbids touching the buffer of an incomplete operation, so the step
      // ends only when its sends have completed too.
      for (auto& s : sends_) {
        if (!s->test()) return false;
      }
      ++g_;
      ++progress_;
      if (g_ < steps()) post_step();
    }
    recvs_.clear();
    sends_.clear();
    return true;
  }

  /// Polls like MpiWork, going back to spinning whenever a message arrives or a step ends (the ring
  /// used to wait for each message on its own).
  void wait(std::chrono::milliseconds timeout) override {
    poll_until_complete(*this, timeout, what_, &progress_);
  }

  void abort() noexcept override {
    if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
    bool unfinished = true;
    try {
      std::lock_guard lock(mu_);
      unfinished = g_ < steps();
      for (auto& w : recvs_) w->abort();
      for (auto& w : sends_) w->abort();
    } catch (...) {  // std::mutex::lock: only on a broken invariant
    }
    // The peers are somewhere in the same ring and wait for messages that will never come.
    if (unfinished) owner_.abort();
  }

 private:
  static constexpr std::size_t kSegment = kSegmentBytes / sizeof(float);

  [[nodiscard]] int steps() const noexcept { return 2 * (n_ - 1); }

  void check_not_aborted() const {
    if (aborted_.load(std::memory_order_acquire) || owner_.aborted())
      SINEW_THROW(CommFailure, "{} was aborted", what_);
  }

  /// Posts step g_'s messages: receives first, so that the neighbour's segments land in place.
  void post_step() {
    Backend& inner = owner_.inner();
    const bool reduce = g_ < n_ - 1;
    const int left = wrap(r_ - 1, n_), right = wrap(r_ + 1, n_);
    const Block out = block_of(data_.size(), n_, wrap(r_ - g_, n_));
    const Block in = block_of(data_.size(), n_, wrap(r_ - g_ - 1, n_));
    const std::span<float> dst =
        reduce ? std::span<float>(incoming_).first(in.count) : data_.subspan(in.offset, in.count);
    recvs_.clear();
    sends_.clear();
    next_ = 0;
    for (std::size_t off = 0; off < in.count; off += kSegment) {
      recvs_.push_back(
          inner.recv(Buffer::of(dst.subspan(off, std::min(kSegment, in.count - off))), left, opts_));
    }
    for (std::size_t off = 0; off < out.count; off += kSegment) {
      const std::size_t len = std::min(kSegment, out.count - off);
      sends_.push_back(inner.send(Buffer::of(data_.subspan(out.offset + off, len)), right, opts_));
      if (stats_ != nullptr) {
        stats_->bytes_sent += len * sizeof(float);
        ++stats_->messages_sent;
      }
    }
  }

  RingBackend& owner_;
  std::span<float> data_;
  Options opts_;
  CommStats* stats_;
  int n_, r_;
  std::string what_;
  std::mutex mu_;
  std::vector<float> incoming_;  // guarded by mu_, as everything below
  int g_ = 0;                    // the step in progress; steps() when done
  Works recvs_, sends_;          // step g_'s messages
  std::size_t next_ = 0;         // recvs_[0, next_) have arrived (and were added)
  std::uint64_t progress_ = 0;   // messages arrived and steps ended; read by wait() on the driving thread
  std::atomic<bool> aborted_{false};
};

bool ring_applies(const Buffer& buf, ReduceOp op) {
  return buf.dtype == DType::kFloat32 && op == ReduceOp::kSum;
}

}  // namespace

Block block_of(std::size_t count, int parts, int i) {
  if (parts < 1 || i < 0 || i >= parts) {
    SINEW_THROW(InvalidArgument, "block_of: block {} of {} does not exist", i, parts);
  }
  const auto p = static_cast<std::size_t>(parts), k = static_cast<std::size_t>(i);
  const std::size_t base = count / p, extra = count % p;
  return {k * base + std::min(k, extra), base + (k < extra ? 1 : 0)};
}

std::unique_ptr<Work> RingBackend::allreduce(Buffer buf, ReduceOp op, const Options& opts) {
  if (!ring_applies(buf, op)) return inner_.allreduce(buf, op, opts);
  if (aborted()) {
    SINEW_THROW(CommFailure, "ring backend was aborted after a failure; rebuild the group before using it");
  }
  if (size() == 1 || buf.count == 0) return std::make_unique<CompletedWork>();
  return std::make_unique<RingWork>(*this, std::span<float>(static_cast<float*>(buf.data), buf.count), opts,
                                    stats_);
}

void RingBackend::allreduce_blocking(Buffer buf, ReduceOp op) {
  if (!ring_applies(buf, op)) {
    inner_.allreduce_blocking(buf, op);
    return;
  }
  Options opts;
  opts.timeout = std::chrono::milliseconds::max();  // no deadline: whoever waits for this thread bounds it
  allreduce(buf, op, opts)->wait(opts.timeout);
}

void RingBackend::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  inner_.abort();
}

}  // namespace sinew::comm::ring
