// The ring backend: Sinew's own bandwidth-optimal ring allreduce over another backend's point-to-point
// operations (faster than the MPI library's allreduce on slow TCP links, see FACTS.md).
//
// RingBackend implements Backend over an inner backend it does not own. The allreduce of float32 sums
// (allreduce, allreduce_blocking) is the ring below; every other operation (other element types or
// reductions, broadcast, allgather, reduce_scatter, allgather_v, send, recv, barrier) is the inner backend's
// own, so a RingBackend can stand wherever a Backend is expected. rank(), size() and abort() are the inner
// backend's too.
//
// The ring splits the buffer into size() nearly equal contiguous blocks (block_of). Reduce-scatter (n-1
// steps: send one block to the right neighbour, receive one from the left and add it), then allgather
// (n-1 steps: pass the reduced blocks on). Each rank sends 2(n-1)/n of the buffer, the minimum for an
// allreduce. Blocks travel in segments of kSegmentBytes, so that adding one segment overlaps with the
// transfer of the next. The allgather copies the final values, so all ranks end bitwise equal.
//
// The ring is collective (all ranks call it in the same order, with the same element count) and its
// messages use the point-to-point tag opts.tag; other traffic on the inner backend must use another tag.
// allreduce() returns at once; the ring advances whenever its Work is tested or waited for (by one thread
// at a time; abort() may come from any thread). The whole
// operation must complete within the timeout given to wait(): otherwise Timeout, and a failed peer
// surfaces as the inner backend's CommFailure. After an exception the buffer is unspecified and the
// backend should be aborted. With one rank (or no elements) the operation is complete at once.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

#include "sinew/comm/backend.hpp"

namespace sinew::comm::ring {

/// Segment size of the ring's messages.
inline constexpr std::size_t kSegmentBytes = 256u << 10;

/// Block `i` of `parts` nearly equal contiguous blocks of `count` elements: the first count % parts
/// blocks have one element more. Throws InvalidArgument for a block that does not exist.
struct Block {
  std::size_t offset = 0;
  std::size_t count = 0;
};
[[nodiscard]] Block block_of(std::size_t count, int parts, int i);

class RingBackend final : public Backend {
 public:
  /// `inner` must outlive this backend and every Work it returns. `stats`, if not null, is added to by
  /// every ring allreduce (bytes and messages this rank sent; not by the delegated operations), on the
  /// thread that drives the Work; it must outlive this backend.
  explicit RingBackend(Backend& inner, CommStats* stats = nullptr) : inner_(inner), stats_(stats) {}

  [[nodiscard]] std::string name() const override { return "ring"; }
  [[nodiscard]] int rank() const override { return inner_.rank(); }
  [[nodiscard]] int size() const override { return inner_.size(); }

  /// Float32 sums: the ring, started here and advanced by the Work's test()/wait(). Aborting that Work
  /// cancels its messages and aborts this backend (the peers are left in the middle of the ring).
  /// Other element types or reductions: the inner backend's allreduce.
  std::unique_ptr<Work> allreduce(Buffer buf, ReduceOp op, const Options& opts) override;
  /// Float32 sums: the ring run to completion on the calling thread (its messages use tag 0), with no
  /// deadline of its own (see Backend::allreduce_blocking): abort() from another thread makes it throw
  /// CommFailure promptly.
  /// Other element types or reductions: the inner backend's allreduce_blocking.
  void allreduce_blocking(Buffer buf, ReduceOp op) override;
  std::unique_ptr<Work> broadcast(Buffer buf, int root, const Options& opts) override {
    return inner_.broadcast(buf, root, opts);
  }
  std::unique_ptr<Work> allgather(Buffer in, Buffer out, const Options& opts) override {
    return inner_.allgather(in, out, opts);
  }
  std::unique_ptr<Work> reduce_scatter(Buffer in, Buffer out, std::span<const std::size_t> counts,
                                       ReduceOp op, const Options& opts) override {
    return inner_.reduce_scatter(in, out, counts, op, opts);
  }
  std::unique_ptr<Work> allgather_v(Buffer buf, std::span<const std::size_t> counts,
                                    const Options& opts) override {
    return inner_.allgather_v(buf, counts, opts);
  }
  std::unique_ptr<Work> send(Buffer buf, int peer, const Options& opts) override {
    return inner_.send(buf, peer, opts);
  }
  std::unique_ptr<Work> recv(Buffer buf, int peer, const Options& opts) override {
    return inner_.recv(buf, peer, opts);
  }
  std::unique_ptr<Work> barrier(const Options& opts) override { return inner_.barrier(opts); }
  /// Fails every ring allreduce in progress or started later (CommFailure), and aborts the inner backend:
  /// the group is given up as a whole, as with any backend.
  void abort() noexcept override;

  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  [[nodiscard]] Backend& inner() const noexcept { return inner_; }

 private:
  Backend& inner_;
  CommStats* stats_;
  std::atomic<bool> aborted_{false};
};

}  // namespace sinew::comm::ring
