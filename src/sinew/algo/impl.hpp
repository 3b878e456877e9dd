// What the algorithms' files share (not part of the API: algorithm.hpp is): the tags of their point-to-point
// exchanges, a few helpers, the base of the algorithms that step locally, and one factory per algorithm,
// which the table in algorithm.cpp (make_named) calls. One file per algorithm: algo/<name>.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "sinew/algo/algorithm.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/comm/ring/backend.hpp"

namespace sinew::algo::impl {

// Point-to-point tags of the model exchanges (the ring and compressed allreduces use the context's tag).
constexpr int kTagPeer = 101;     // shift_one: the whole model to this round's peer
constexpr int kTagToRight = 102;  // low_precision_decentralized: a compressed difference to the right
constexpr int kTagToLeft = 103;   // ... and to the left
constexpr int kTagAsync = 104;    // async: the background thread's ring allreduces

/// Bytes one rank sends in a bandwidth-optimal allreduce of `elements` floats over `n` ranks.
inline std::uint64_t allreduce_bytes(std::size_t elements, int n) {
  return n <= 1 ? 0
                : 2 * static_cast<std::uint64_t>(n - 1) * elements * sizeof(float) /
                      static_cast<std::uint64_t>(n);
}

/// Sends `out` to `to` and receives `in` from `from`, both with the context's deadline.
inline void exchange(comm::Backend& b, comm::Buffer out, int to, comm::Buffer in, int from, comm::Options o,
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
inline void scale(std::span<float> v, float f) {
  for (auto& x : v) x *= f;
}

/// Sums a buffer over the group in place with our ring (comm/ring/), bounded by `op`'s deadline.
inline void ring_sum(comm::ring::RingBackend& ring, std::span<float> v, const comm::Options& op) {
  ring.allreduce_sync(comm::Buffer::of(v), comm::ReduceOp::kSum, op);
}

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

std::unique_ptr<Algorithm> make_gradient_allreduce(Context ctx, AllreduceImpl impl);
std::unique_ptr<Algorithm> make_bytegrad(Context ctx, const AlgorithmOptions& o);
std::unique_ptr<Algorithm> make_qadam(Context ctx, const AlgorithmOptions& o);
std::unique_ptr<Algorithm> make_powersgd(Context ctx, const AlgorithmOptions& o);
std::unique_ptr<Algorithm> make_decentralized(Context ctx, const AlgorithmOptions& o);
std::unique_ptr<Algorithm> make_low_precision_decentralized(Context ctx, const AlgorithmOptions& o);
std::unique_ptr<Algorithm> make_async(Context ctx, const AlgorithmOptions& o);

}  // namespace sinew::algo::impl
