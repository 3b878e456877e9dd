#include "sinew/algo/algorithm.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "sinew/algo/impl.hpp"
#include "sinew/algo/lowrank.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

// The table of algorithms (make_named) and `auto`; each algorithm lives in its own file (algo/impl.hpp).
namespace sinew::algo {

using impl::allreduce_bytes;
using impl::ring_sum;
using impl::scale;

namespace {

std::unique_ptr<Algorithm> make_named(Kind kind, const AlgorithmOptions& o, Context ctx) {
  switch (kind) {
    case Kind::kGradientAllreduce:
      return impl::make_gradient_allreduce(std::move(ctx), o.allreduce);
    case Kind::kByteGrad:
      return impl::make_bytegrad(std::move(ctx), o);
    case Kind::kPowerSgd:
      return impl::make_powersgd(std::move(ctx), o);
    case Kind::kQAdam:
      return impl::make_qadam(std::move(ctx), o);
    case Kind::kDecentralized:
      return impl::make_decentralized(std::move(ctx), o);
    case Kind::kLowPrecisionDecentralized:
      return impl::make_low_precision_decentralized(std::move(ctx), o);
    case Kind::kAsync:
      return impl::make_async(std::move(ctx), o);
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

void Algorithm::step(std::int64_t, float lr) {
  if (ctx_.optimizer_step)
    ctx_.optimizer_step(lr);
  else
    ctx_.workload.optimizer_step(lr);
}

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
