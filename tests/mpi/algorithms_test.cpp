// Each communication algorithm (docs/algorithms.md), built with algo::make_algorithm over the MPI backend,
// against a reference the test computes itself from every rank's inputs (each rank can compute every
// rank's values, so no reference needs communication):
//   bytegrad       reduce_bucket is the exact sum within the 8-bit quantiser's bound (collectives.hpp), and
//                  error feedback carries the residual: summed over steps, nothing is lost;
//   qadam          bit for bit plain Adam during the warm-up, then the documented frozen-variance update
//                  with the averaged momentum within the quantiser's bound;
//   decentralized  `all`: the exact average of the models after the local steps; `shift_one`: the pairwise
//                  average with algo::shift_one_peer's partner of the round; nothing between intervals;
//   low_precision_decentralized  the CHOCO gossip step x += (x̂_left + x̂_right - 2 x̂_self) / 3;
//   async          background rounds average the models; consensus() leaves every rank with the average;
//   powersgd       the exact sum during the warm-up; then the exact sum of a rank-1 gradient sum, vectors
//                  exact, at a fraction of the bytes; error feedback conserves what went in.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../support/flat_workload.hpp"
#include "sinew/algo/algorithm.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/optim/optimizer.hpp"

using namespace sinew;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kParams = 1003;  // several blocks and chunks; not a multiple of any rank count

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

std::uint64_t mix(std::uint64_t seed, int rank, std::size_t i) {
  std::uint64_t z =
      seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ULL + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Rank `rank`'s element `i` for `seed`, uniform in [-1, 1): what the quantiser sees in practice.
float uniform(std::uint64_t seed, int rank, std::size_t i) {
  return static_cast<float>(mix(seed, rank, i) >> 40) / static_cast<float>(1 << 23) - 1.f;
}

/// Rank `rank`'s element `i` for `seed`: a multiple of 1/64 in [-1, 1]. Sums of a few of them are exact in
/// float in any order, so a reference can be compared bit for bit with a reduction over ranks.
float dyadic(std::uint64_t seed, int rank, std::size_t i) {
  return static_cast<float>(static_cast<int>(mix(seed, rank, i) % 129) - 64) / 64.f;
}

template <class F>
std::vector<float> values(F f, std::uint64_t seed, int rank, std::size_t count = kParams) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = f(seed, rank, i);
  return v;
}

/// Every rank's `v`, in rank order (over MPI_COMM_WORLD, not the backend under test).
std::vector<std::vector<float>> allgather(const std::vector<float>& v) {
  const int n = world_size();
  std::vector<float> all(v.size() * static_cast<std::size_t>(n));
  MPI_Allgather(v.data(), static_cast<int>(v.size()), MPI_FLOAT, all.data(), static_cast<int>(v.size()),
                MPI_FLOAT, MPI_COMM_WORLD);
  std::vector<std::vector<float>> out;
  for (int k = 0; k < n; ++k) {
    const auto b = all.begin() + static_cast<std::ptrdiff_t>(v.size() * static_cast<std::size_t>(k));
    out.emplace_back(b, b + static_cast<std::ptrdiff_t>(v.size()));
  }
  return out;
}

/// The element-wise mean of `vs`, in double.
std::vector<double> mean_of(const std::vector<std::vector<float>>& vs) {
  std::vector<double> m(vs.at(0).size(), 0.0);
  for (const auto& v : vs) {
    for (std::size_t i = 0; i < v.size(); ++i) m[i] += v[i];
  }
  for (auto& x : m) x /= static_cast<double>(vs.size());
  return m;
}

double max_over_ranks(double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return x;
}

float range_of(std::span<const float> v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

/// Every rank holds the same bytes as rank 0.
void expect_same_on_every_rank(const std::vector<float>& v, const char* what) {
  const auto all = allgather(v);
  for (std::size_t k = 1; k < all.size(); ++k) {
    EXPECT_EQ(std::memcmp(all[k].data(), all[0].data(), v.size() * sizeof(float)), 0)
        << what << ": rank " << k << " differs from rank 0";
  }
}

/// The optimiser's state buffer `name` (a copy).
std::vector<float> state_of(optim::Optimizer& o, const std::string& name) {
  for (auto& [n, buf] : o.state()) {
    if (n == name) return {buf.begin(), buf.end()};
  }
  ADD_FAILURE() << "no optimiser state " << name;
  return {};
}

/// Expects |got[i] - want(i)| <= tol(i) for every element, as one expectation that names the number of
/// elements off and the first of them. (No ASSERT in these tests before a collective: a rank that returned
/// early would leave the others waiting in it until the deadline.)
template <class Want, class Tol>
void expect_close(const std::vector<float>& got, Want want, Tol tol, const char* what) {
  std::size_t off = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::abs(static_cast<double>(got[i]) - want(i)) <= tol(i)) && off++ == 0) first = i;
  }
  EXPECT_EQ(off, 0u) << what << ": " << off << " of " << got.size() << " elements off; element " << first
                     << " is " << (got.empty() ? 0.f : got[first]) << ", expected " << want(first) << " +- "
                     << tol(first);
}

/// Copies `from` into `to` in place: the algorithm's context holds spans of the rig's vectors, so they are
/// never reassigned.
void put(std::vector<float>& to, const std::vector<float>& from) {
  ASSERT_EQ(to.size(), from.size());
  std::copy(from.begin(), from.end(), to.begin());
}

/// One rank's training state and the algorithm over it, as the trainer wires them. The vectors are
/// sized once: the algorithm holds spans of them.
struct Rig {
  Rig(algo::AlgorithmOptions opts, const optim::OptimizerOptions& oo, std::vector<float> p,
      std::vector<float> g, std::vector<TensorView> tensors = {})
      : backend(mpi::Communicator::borrow(MPI_COMM_WORLD)),
        work(std::move(p), std::move(g), oo, std::move(tensors)),
        params(work.param_vector()),
        grads(work.grad_vector()),
        optimizer(&work.optimizer()) {
    comm::Options op;
    op.timeout = 30s;  // a hang fails the test long before ctest's deadline
    algorithm = algo::make_algorithm(opts, algo::Context{.backend = backend,
                                                         .workload = work,
                                                         .op = op,
                                                         .compute_ms = [] { return 1.0; },
                                                         .event = {},
                                                         .optimizer_step = {},
                                                         .scatter_bucket = {}});
  }
  [[nodiscard]] int rank() const { return backend.rank(); }
  [[nodiscard]] int size() const { return backend.size(); }
  std::vector<float> state(const std::string& name) { return state_of(*optimizer, name); }

  comm::mpi::MpiBackend backend;
  test_support::FlatWorkload work;
  std::vector<float>& params;  // the workload's
  std::vector<float>& grads;
  optim::Optimizer* optimizer;
  std::unique_ptr<algo::Algorithm> algorithm;  // last: destroyed first (async's thread uses the rest)
};

optim::OptimizerOptions sgd(float momentum) {
  optim::OptimizerOptions o;
  o.name = "sgd";
  o.momentum = momentum;
  return o;
}

algo::AlgorithmOptions named(const std::string& name) {
  algo::AlgorithmOptions o;
  o.kind = parse_name(algo::kAlgorithmNames, name, "test");
  return o;
}

/// Reduces the gradients bucket by bucket as the bucketer does: the last layers' bucket first, each
/// with its offset in the gradients.
void reduce_in_buckets(Rig& r) {
  const std::size_t split = 600;
  std::span<float> g(r.grads);
  r.algorithm->reduce_bucket(g.subspan(split), split);
  r.algorithm->reduce_bucket(g.subspan(0, split), 0);
}

/// The bound of compressed_allreduce (collectives.hpp) for inputs whose per-rank range is at most
/// `range`: (2n - 1) * range / 508. The 1 % covers the rounding of the quantiser's step up to 16
/// significant bits and the first-stage error inside the re-quantised sum; `magnitude` the float
/// rounding of sums of that size.
double quantised_sum_bound(int n, double range, double magnitude) {
  return (2.0 * n - 1.0) * range / 508.0 * 1.01 + 1e-6 * n * magnitude;
}

/// After consensus(): parameters and momentum are the averages taken before it, on every rank alike.
void expect_averaged(const std::vector<float>& params, const std::vector<double>& params_mean,
                     const std::vector<float>& momentum, const std::vector<double>& momentum_mean) {
  expect_close(
      params, [&](std::size_t i) { return params_mean[i]; },
      [&](std::size_t i) { return 1e-6 * (1 + std::abs(params_mean[i])); }, "the parameters");
  expect_close(
      momentum, [&](std::size_t i) { return momentum_mean[i]; },
      [&](std::size_t i) { return 1e-6 * (1 + std::abs(momentum_mean[i])); }, "the momentum");
  expect_same_on_every_rank(params, "parameters");
  expect_same_on_every_rank(momentum, "momentum");
}

}  // namespace

// ---- ByteGrad --------------------------------------------------------------------------------------------

TEST(ByteGrad, ReduceBucketIsTheExactSumWithinTheQuantisersBound) {
  auto o = named("bytegrad");
  o.chunk = 64;
  const int n = world_size();
  Rig r(o, sgd(0), std::vector<float>(kParams, 0.f), values(uniform, 11, world_rank()));
  ASSERT_EQ(r.algorithm->name(), "bytegrad");
  EXPECT_TRUE(r.algorithm->reduces_gradients(1));
  EXPECT_FALSE(r.algorithm->uses_backend_allreduce());
  (void)r.algorithm->take_bytes_sent();
  reduce_in_buckets(r);

  // Inputs in [-1, 1): each rank's range is below 2 (and every chunk's is below its buffer's).
  const double bound = quantised_sum_bound(n, 2.0, n);
  std::vector<double> exact(kParams, 0.0);
  double worst = 0;
  for (std::size_t i = 0; i < kParams; ++i) {
    for (int k = 0; k < n; ++k) exact[i] += uniform(11, k, i);
    worst = std::max(worst, std::abs(r.grads[i] - exact[i]));
  }
  expect_close(
      r.grads, [&](std::size_t i) { return exact[i]; }, [&](std::size_t) { return bound; },
      "the reduced gradients against the exact sum");
  // It did quantise (an exact allreduce would pass the bound too, at four times the bytes).
  EXPECT_GT(worst, 1e-4) << "no quantisation error at all";
  const std::uint64_t exact_bytes = 2 * static_cast<std::uint64_t>(n - 1) * kParams * sizeof(float) / n;
  const std::uint64_t sent = r.algorithm->take_bytes_sent();
  EXPECT_GT(sent, 0u);
  EXPECT_LT(sent, exact_bytes / 2) << "8-bit codes should take about a quarter of the float bytes";
  expect_same_on_every_rank(r.grads, "reduced gradients");
}

TEST(ByteGrad, ErrorFeedbackCarriesTheResidualSoNothingIsLostOverSteps) {
  auto o = named("bytegrad");
  o.chunk = 64;
  o.error_feedback = true;
  const int n = world_size();
  Rig r(o, sgd(0), std::vector<float>(kParams, 0.f), std::vector<float>(kParams, 0.f));
  const auto mine = values(uniform, 23, r.rank());  // the same gradients every step
  std::vector<double> exact(kParams, 0.0);
  for (int k = 0; k < n; ++k) {
    for (std::size_t i = 0; i < kParams; ++i) exact[i] += uniform(23, k, i);
  }
  constexpr int kSteps = 40;
  std::vector<double> applied(kParams, 0.0);  // the sum of the reduced gradients over the steps
  for (int t = 0; t < kSteps; ++t) {
    put(r.grads, mine);
    reduce_in_buckets(r);
    for (std::size_t i = 0; i < kParams; ++i) applied[i] += r.grads[i];
  }
  const auto state = r.algorithm->rank_state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "algo/residual");
  ASSERT_EQ(state[0].second.size(), kParams);
  std::vector<double> residuals(state[0].second.begin(), state[0].second.end());
  MPI_Allreduce(MPI_IN_PLACE, residuals.data(), static_cast<int>(kParams), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);

  // Conservation (collectives.hpp): what was applied plus what the ranks still carry is what went in.
  // And since each residual stays below one step's quantisation error, the error of the sum over all
  // steps is no larger than one step's: it does not grow with the steps (without error feedback it would
  // be kSteps times one step's error, as the inputs repeat).
  const double one_step = quantised_sum_bound(n, 2.0 + 2.0 / 254, n);  // input + residual: a bit wider
  double worst = 0, unbalanced = 0;
  for (std::size_t i = 0; i < kParams; ++i) {
    const double want = kSteps * exact[i];
    unbalanced = std::max(unbalanced, std::abs(applied[i] + residuals[i] - want));
    worst = std::max(worst, std::abs(applied[i] - want));
  }
  EXPECT_LE(unbalanced, 1e-4 * kSteps) << "applied + residuals differ from the inputs' sum";
  EXPECT_LE(worst, one_step) << "the error accumulated over " << kSteps << " steps";
  EXPECT_GT(*std::max_element(residuals.begin(), residuals.end()), 1e-5) << "nothing was carried";
}

// ---- PowerSGD -------------------------------------------------------------------------------------------

namespace {

// kParams floats as layers: a 40 x 20 matrix and its bias, a 10 x 18 matrix and its bias. Rank 2 compresses
// both matrices ((40 + 20) * 2 * 2 <= 800, (10 + 18) * 2 * 2 <= 180).
const std::vector<TensorView> kLayers = {{"fc1/weight", "params", 0, {40, 20}, ""},
                                         {"fc1/bias", "params", 800, {20}, ""},
                                         {"fc2/weight", "params", 820, {10, 18}, ""},
                                         {"fc2/bias", "params", 1000, {3}, ""}};

/// Two buckets of whole layers, the last layer's first, as the bucketer hands them over.
void reduce_layers(Rig& r, std::int64_t step) {
  std::span<float> g(r.grads);
  r.algorithm->begin_step(step);
  r.algorithm->reduce_bucket(g.subspan(820), 820);
  r.algorithm->reduce_bucket(g.subspan(0, 820), 0);
}

/// Rank `rank`'s gradient whose sum over ranks has rank 1 in each matrix: the matrices are a_rank b^T with
/// the same b on every rank (dyadic values, so the sums are exact), the biases any dyadic values.
std::vector<float> rank_one_grads(int rank) {
  std::vector<float> g = values(dyadic, 31, rank);
  for (const auto& t : kLayers) {
    if (t.cols() == 1) continue;
    for (std::size_t i = 0; i < t.rows(); ++i) {
      for (std::size_t j = 0; j < t.cols(); ++j) {
        g[t.offset + i * t.cols() + j] = dyadic(37, rank, i) * (dyadic(41, 0, j) + 2.f);
      }
    }
  }
  return g;
}

algo::AlgorithmOptions powersgd(int rank, std::int64_t warmup) {
  auto o = named("powersgd");
  o.powersgd_rank = rank;
  o.powersgd_warmup_steps = warmup;
  return o;
}

}  // namespace

TEST(PowerSGD, WarmUpStepsAreTheExactSum) {
  Rig r(powersgd(2, 3), sgd(0), std::vector<float>(kParams, 0.f), values(dyadic, 5, world_rank()), kLayers);
  ASSERT_EQ(r.algorithm->name(), "powersgd");
  EXPECT_TRUE(r.algorithm->reduces_gradients(1));
  EXPECT_FALSE(r.algorithm->uses_backend_allreduce());
  reduce_layers(r, 3);
  std::vector<float> exact(kParams, 0.f);
  for (int k = 0; k < world_size(); ++k) {
    for (std::size_t i = 0; i < kParams; ++i) exact[i] += dyadic(5, k, i);
  }
  EXPECT_EQ(std::memcmp(r.grads.data(), exact.data(), kParams * sizeof(float)), 0)
      << "a warm-up step is not the exact sum";
}

TEST(PowerSGD, ARankOneSumComesThroughWithVectorsExactAtAFractionOfTheBytes) {
  const int n = world_size();
  Rig r(powersgd(2, 0), sgd(0), std::vector<float>(kParams, 0.f), rank_one_grads(world_rank()), kLayers);
  (void)r.algorithm->take_bytes_sent();
  reduce_layers(r, 1);
  std::vector<double> exact(kParams, 0.0);
  for (int k = 0; k < n; ++k) {
    const auto g = rank_one_grads(k);
    for (std::size_t i = 0; i < kParams; ++i) exact[i] += g[i];
  }
  // One power iteration recovers a rank-1 matrix exactly (up to float rounding), and vectors are summed
  // exactly (dyadic values).
  expect_close(
      r.grads, [&](std::size_t i) { return exact[i]; },
      [&](std::size_t i) { return 1e-5 * (1 + std::abs(exact[i])) * n; }, "the approximated sum");
  for (const auto& t : kLayers) {
    if (t.cols() != 1) continue;
    for (std::size_t i = t.offset; i < t.offset + t.rows(); ++i) EXPECT_EQ(r.grads[i], exact[i]) << i;
  }
  expect_same_on_every_rank(r.grads, "reduced gradients");
  // P and Q of both matrices plus the 23 bias elements, against every element in an exact allreduce.
  const std::size_t floats = (40 + 20) * 2 + (10 + 18) * 2 + 23;
  const auto per_rank = [&](std::size_t f) { return 2 * static_cast<std::uint64_t>(n - 1) * f * 4 / n; };
  const std::uint64_t sent = r.algorithm->take_bytes_sent();
  EXPECT_LE(sent, per_rank(floats) + 8) << "more bytes than two factor allreduces";
  EXPECT_LT(sent * 4, per_rank(kParams)) << "PowerSGD should send well under a quarter of the floats";
}

TEST(PowerSGD, ErrorFeedbackConservesWhatWentInOverSteps) {
  const int n = world_size();
  Rig r(powersgd(2, 0), sgd(0), std::vector<float>(kParams, 0.f), std::vector<float>(kParams, 0.f), kLayers);
  const auto mine = values(uniform, 29, r.rank());  // full-rank gradients: rank 2 misses most of them
  std::vector<double> exact(kParams, 0.0);
  for (int k = 0; k < n; ++k) {
    for (std::size_t i = 0; i < kParams; ++i) exact[i] += uniform(29, k, i);
  }
  double scale = 0;
  for (double x : exact) scale = std::max(scale, std::abs(x));
  constexpr int kSteps = 60, kEarly = 20;
  std::vector<double> applied(kParams, 0.0);
  double early = 0;  // how far the applied sum was off after kEarly steps
  auto off = [&](int t) {
    double worst = 0;
    for (std::size_t i = 0; i < kParams; ++i) worst = std::max(worst, std::abs(applied[i] - t * exact[i]));
    return worst;
  };
  for (int t = 1; t <= kSteps; ++t) {
    put(r.grads, mine);
    reduce_layers(r, t);
    for (std::size_t i = 0; i < kParams; ++i) applied[i] += r.grads[i];
    if (t == kEarly) early = off(t);
  }
  const auto state = r.algorithm->rank_state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "algo/powersgd_error");
  ASSERT_EQ(state[0].second.size(), kParams);
  std::vector<double> memory(state[0].second.begin(), state[0].second.end());
  MPI_Allreduce(MPI_IN_PLACE, memory.data(), static_cast<int>(kParams), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  // Summed over ranks and steps: what was applied plus what the memories still hold is what went in.
  double unbalanced = 0;
  for (std::size_t i = 0; i < kParams; ++i)
    unbalanced = std::max(unbalanced, std::abs(applied[i] + memory[i] - kSteps * exact[i]));
  EXPECT_LE(unbalanced, 1e-4 * kSteps * n) << "applied + memories differ from the inputs' sum";
  // The memories' sum stays bounded (the warm-started power iteration works through the spectrum), so
  // the applied sum keeps up with the true one: its error does not grow from step 20 to step 60 (with
  // the approximation alone, no memory, it would grow with every step), and is a small part of the total.
  const double late = off(kSteps);
  EXPECT_LT(late, 1.5 * early) << "the error of the applied sum grew from " << early << " to " << late;
  EXPECT_LT(late, 0.25 * kSteps * scale) << "the applied sum lags the true one";
  EXPECT_GT(*std::max_element(memory.begin(), memory.end()), 1e-3) << "nothing was carried";
}

// ---- QAdam -----------------------------------------------------------------------------------------------

/// QAdam with `warmup_steps` exact steps and the run's Adam settings: the algorithm's options and Adam's.
std::pair<algo::AlgorithmOptions, optim::OptimizerOptions> qadam(std::int64_t warmup_steps) {
  auto o = named("qadam");
  o.qadam_warmup_steps = warmup_steps;
  o.chunk = 128;
  optim::OptimizerOptions adam;
  adam.name = "adam";
  o.beta1 = adam.beta1;
  o.beta2 = adam.beta2;
  o.eps = adam.eps;
  return {o, adam};
}

TEST(QAdam, IsPlainAdamDuringWarmUpThenTheFrozenVarianceUpdateWithinTheBound) {
  const auto options = qadam(3);  // not a structured binding: lambdas below capture `o`
  const algo::AlgorithmOptions& o = options.first;
  const optim::OptimizerOptions& adam = options.second;
  const int n = world_size();
  const float lr = 0.01f;
  const auto p0 = values(dyadic, 5, 0);  // replicated: the same on every rank
  Rig r(o, adam, p0, std::vector<float>(kParams, 0.f));
  ASSERT_EQ(r.algorithm->name(), "qadam");
  auto reference = optim::make_optimizer(adam, kParams);
  std::vector<float> ref_params = p0;
  std::vector<float> v_frozen;
  for (std::int64_t s = 1; s <= 6; ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s);
    put(r.grads, values(dyadic, 100 + static_cast<std::uint64_t>(s), r.rank()));  // this rank's share
    std::vector<float> global(kParams, 0.f);  // the exact sum: dyadic, so exact in any order
    for (int k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < kParams; ++i)
        global[i] += dyadic(100 + static_cast<std::uint64_t>(s), k, i);
    }
    const bool warm_up = s <= o.qadam_warmup_steps;
    // Both the warm-up's gradients and the later momenta are exchanged bucket by bucket during backward.
    EXPECT_TRUE(r.algorithm->reduces_gradients(s));
    r.algorithm->begin_step(s);
    if (warm_up) {
      reduce_in_buckets(r);
      EXPECT_EQ(r.grads, global) << "the warm-up's gradient reduction is exact";
      r.algorithm->step(s, lr);
      r.algorithm->after_step(s);
      reference->step(ref_params, global, lr);
      // The same Adam on the same inputs: bit for bit.
      EXPECT_EQ(std::memcmp(r.params.data(), ref_params.data(), kParams * sizeof(float)), 0)
          << "the parameters differ from plain Adam's";
      EXPECT_EQ(r.state("adam_m"), state_of(*reference, "adam_m"));
      EXPECT_EQ(r.state("adam_v"), state_of(*reference, "adam_v"));
      if (s == o.qadam_warmup_steps) v_frozen = r.state("adam_v");
      continue;
    }
    // After the warm-up, from this rank's state before the step: the documented update with the exact
    // average of the ranks' momenta, m = b1 m + (1 - b1) * (sum of the shares), and the variance frozen.
    const auto m_before = r.state("adam_m");
    const auto p_before = r.params;
    const std::int64_t t = r.optimizer->steps() + 1;
    // Each rank's momentum input to the compressed allreduce; the largest range over ranks sets the bound.
    std::vector<float> local(kParams);
    for (std::size_t i = 0; i < kParams; ++i)
      local[i] = o.beta1 * m_before[i] + (1.f - o.beta1) * static_cast<float>(n) * r.grads[i];
    const double range = max_over_ranks(range_of(local));
    const double m_bound = quantised_sum_bound(n, range, 2.0 * n) / n;  // of the average, not the sum
    reduce_in_buckets(r);
    r.algorithm->step(s, lr);
    r.algorithm->after_step(s);
    EXPECT_EQ(r.optimizer->steps(), t);
    EXPECT_EQ(r.state("adam_v"), v_frozen) << "the variance is frozen after the warm-up";
    const auto m = r.state("adam_m");
    const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), static_cast<double>(t));
    const double bc2 =
        1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(o.qadam_warmup_steps));
    auto m_exact = [&](std::size_t i) {
      return o.beta1 * static_cast<double>(m_before[i]) + (1.0 - o.beta1) * static_cast<double>(global[i]);
    };
    auto denom = [&](std::size_t i) {
      return std::sqrt(static_cast<double>(v_frozen[i])) / std::sqrt(bc2) + o.eps;
    };
    expect_close(
        m, m_exact, [&](std::size_t) { return m_bound; }, "the momentum");
    // The momentum's error through the update, plus the float rounding of the update itself.
    expect_close(
        r.params, [&](std::size_t i) { return p_before[i] - lr / bc1 * m_exact(i) / denom(i); },
        [&](std::size_t i) {
          return lr / bc1 * m_bound / denom(i) + 1e-5 * std::abs(lr / bc1 * m_exact(i) / denom(i)) + 1e-6;
        },
        "the parameters");
    double worst_m = 0;
    for (std::size_t i = 0; i < kParams; ++i) worst_m = std::max(worst_m, std::abs(m[i] - m_exact(i)));
    EXPECT_GT(worst_m, 0.0) << "the momenta were not quantised";
    expect_same_on_every_rank(r.params, "parameters");
  }
}

TEST(QAdam, ACoordinateWithoutGradientInTheWarmUpStepsLikeItsTensor) {
  const auto options = qadam(2);  // not a structured binding: lambdas below capture `o`
  const algo::AlgorithmOptions& o = options.first;
  const optim::OptimizerOptions& adam = options.second;
  const float lr = 0.01f;
  Rig r(o, adam, values(dyadic, 5, 0), std::vector<float>(kParams, 0.f), kLayers);
  // Dead during the warm-up: half of fc1/weight (units of a ReLU layer that nothing activated) and the
  // whole of fc2/bias; alive again afterwards.
  auto dead = [](std::size_t i) { return i < 400 || i >= 1000; };
  std::vector<float> v_warm;
  for (std::int64_t s = 1; s <= 3; ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s);
    auto g = values(dyadic, 200 + static_cast<std::uint64_t>(s), r.rank());
    if (s <= o.qadam_warmup_steps) {
      for (std::size_t i = 0; i < kParams; ++i) {
        if (dead(i)) g[i] = 0.f;
      }
    }
    put(r.grads, g);
    const auto p_before = r.params;
    r.algorithm->begin_step(s);
    reduce_in_buckets(r);
    r.algorithm->step(s, lr);
    r.algorithm->after_step(s);
    if (s == o.qadam_warmup_steps) {
      v_warm = r.state("adam_v");
      for (std::size_t i = 0; i < kParams; ++i) {
        if (dead(i)) {
          ASSERT_EQ(v_warm[i], 0.f) << i;
        }
      }
    }
    if (s <= o.qadam_warmup_steps) continue;
    auto mean_nonzero = [&](std::size_t first, std::size_t last) {
      double sum = 0;
      int k = 0;
      for (std::size_t i = first; i < last; ++i) {
        if (v_warm[i] > 0.f) {
          sum += v_warm[i];
          ++k;
        }
      }
      return static_cast<float>(sum / k);
    };
    const auto v = r.state("adam_v");
    const float fc1 = mean_nonzero(0, 800), all = mean_nonzero(0, kParams);
    for (std::size_t i = 0; i < kParams; ++i) {
      const float want = !dead(i) ? v_warm[i] : i < 400 ? fc1 : all;
      ASSERT_FLOAT_EQ(v[i], want) << "the frozen variance at " << i;
    }
    // Adam's steps are about lr in size; with a variance of 0 they would be lr * m / eps, ~1e5 times more.
    double largest = 0;
    for (std::size_t i = 0; i < kParams; ++i) {
      ASSERT_TRUE(std::isfinite(r.params[i])) << i;
      largest = std::max(largest, static_cast<double>(std::abs(r.params[i] - p_before[i])));
    }
    EXPECT_LT(largest, 20 * lr) << "a coordinate that saw no gradient in the warm-up took a huge step";
    EXPECT_GT(largest, 0.01 * lr) << "nothing moved";
    expect_same_on_every_rank(r.params, "parameters");
  }
}

// ---- decentralized ---------------------------------------------------------------------------------------

TEST(Decentralized, AllAveragesTheModelsAfterTheLocalSteps) {
  auto o = named("decentralized");
  o.peer_selection = "all";
  o.comm_interval = 2;
  const int n = world_size();
  const float lr = 0.5f;
  // The models have drifted apart.
  Rig r(o, sgd(0), values(dyadic, 7, world_rank()), std::vector<float>(kParams));
  std::vector<std::vector<float>> models;
  for (int k = 0; k < n; ++k) models.push_back(values(dyadic, 7, k));
  for (std::int64_t s = 1; s <= 2; ++s) {
    SCOPED_TRACE(testing::Message() << "step " << s);
    EXPECT_FALSE(r.algorithm->reduces_gradients(s));
    put(r.grads, values(dyadic, 30 + static_cast<std::uint64_t>(s), r.rank()));
    // Local step on this rank's own mean gradient: its share times n.
    for (int k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < kParams; ++i)
        models[static_cast<std::size_t>(k)][i] -=
            lr * static_cast<float>(n) * dyadic(30 + static_cast<std::uint64_t>(s), k, i);
    }
    r.algorithm->step(s, lr);
    r.algorithm->after_step(s);
    if (s == 1) {  // not an exchange step (interval 2): each rank keeps its own model
      EXPECT_EQ(r.params, models[static_cast<std::size_t>(r.rank())]);
      continue;
    }
    const auto mean = mean_of(models);
    expect_close(
        r.params, [&](std::size_t i) { return mean[i]; },
        [&](std::size_t i) { return 1e-6 * (1 + std::abs(mean[i])); }, "the parameters against the average");
    expect_same_on_every_rank(r.params, "parameters");
  }
}

TEST(Decentralized, ShiftOneAveragesWithThePeerOfEachRound) {
  auto o = named("decentralized");
  o.peer_selection = "shift_one";
  o.comm_interval = 1;
  const int n = world_size();
  Rig r(o, sgd(0), values(dyadic, 9, world_rank()), std::vector<float>(kParams));
  std::vector<std::vector<float>> models;
  for (int k = 0; k < n; ++k) models.push_back(values(dyadic, 9, k));
  for (std::int64_t s = 1; s <= n + 1; ++s) {  // every pairing, and a round of the next cycle
    SCOPED_TRACE(testing::Message() << "round " << s);
    r.algorithm->after_step(s);
    auto next = models;
    for (int k = 0; k < n; ++k) {
      const int peer = algo::shift_one_peer(k, n, s);
      if (peer < 0) continue;  // odd group: k sits this round out
      EXPECT_EQ(algo::shift_one_peer(peer, n, s), k) << "a pairing is symmetric";
      for (std::size_t i = 0; i < kParams; ++i)
        next[static_cast<std::size_t>(k)][i] =
            0.5f * (models[static_cast<std::size_t>(k)][i] + models[static_cast<std::size_t>(peer)][i]);
    }
    models = next;
    EXPECT_EQ(r.params, models[static_cast<std::size_t>(r.rank())]) << "rank " << r.rank();
  }
}

TEST(Decentralized, ConsensusAveragesModelsAndOptimiserState) {
  auto o = named("decentralized");
  o.peer_selection = "shift_one";
  Rig r(o, sgd(0.9f), values(dyadic, 13, world_rank()), values(dyadic, 14, world_rank()));
  r.algorithm->step(1, 0.1f);  // momentum buffers now differ between ranks
  const auto params_mean = mean_of(allgather(r.params));
  const auto momentum_mean = mean_of(allgather(r.state("momentum")));
  r.algorithm->consensus();
  const auto momentum = r.state("momentum");
  expect_averaged(r.params, params_mean, momentum, momentum_mean);
}

// ---- low-precision decentralized (CHOCO-SGD on a ring) ------------------------------------------------

namespace {
/// The ring neighbours of `rank` among `n`.
int left_of(int rank, int n) { return (rank + n - 1) % n; }
int right_of(int rank, int n) { return (rank + 1) % n; }
}  // namespace

TEST(LowPrecisionDecentralized, FirstExchangeIsTheRingGossipStep) {
  // The estimates start exact (an exchange at construction): the first difference sent is zero, which
  // the quantiser keeps exact, so the step is x_k += (x_left + x_right - 2 x_k) / 3 exactly as documented.
  const int n = world_size();
  Rig r(named("low_precision_decentralized"), sgd(0), values(uniform, 17, world_rank()),
        std::vector<float>(kParams));
  r.algorithm->after_step(1);
  const auto x = values(uniform, 17, r.rank());
  const auto xl = values(uniform, 17, left_of(r.rank(), n));
  const auto xr = values(uniform, 17, right_of(r.rank(), n));
  expect_close(
      r.params, [&](std::size_t i) { return x[i] + (static_cast<double>(xl[i]) + xr[i] - 2.0 * x[i]) / 3.0; },
      [](std::size_t) { return 1e-6; }, "x + (x_left + x_right - 2 x) / 3");
}

TEST(LowPrecisionDecentralized, GossipKeepsTheMeanAndContractsToConsensus) {
  // With quantised differences (after a local step the models are ahead of their estimates), every rank
  // still moves by a combination of estimates that all ranks hold identically (decoded from the same
  // bytes), and those terms cancel over the ring: the mean over ranks is unchanged by after_step. And each
  // rank moves towards its neighbours: the distance to consensus shrinks round after round.
  Rig r(named("low_precision_decentralized"), sgd(0), values(uniform, 19, world_rank()),
        values(uniform, 20, world_rank()));
  r.algorithm->step(1, 0.05f);  // local step: now x != x̂
  auto mean = mean_of(allgather(r.params));
  auto distance = [&] {
    double d = 0;
    for (std::size_t i = 0; i < kParams; ++i) d = std::max(d, std::abs(r.params[i] - mean[i]));
    return max_over_ranks(d);
  };
  const double d0 = distance();
  EXPECT_GT(d0, 0.5);
  double d = d0;
  for (std::int64_t s = 1; s <= 30; ++s) {
    SCOPED_TRACE(testing::Message() << "round " << s);
    r.algorithm->after_step(s);
    const auto now = mean_of(allgather(r.params));
    double moved = 0;
    for (std::size_t i = 0; i < kParams; ++i) moved = std::max(moved, std::abs(now[i] - mean[i]));
    EXPECT_LE(moved, 2e-5) << "the mean over the ranks moved";  // float rounding only: ~1e-7 a round
    d = distance();
    if (s == 1) {
      EXPECT_LT(d, 0.9 * d0) << "the first round moves the ranks towards each other";
    }
  }
  EXPECT_LT(d, 1e-3 * d0) << "no consensus after 30 rounds";
}

TEST(LowPrecisionDecentralized, ConsensusLeavesEveryRankWithTheAverage) {
  Rig r(named("low_precision_decentralized"), sgd(0.9f), values(uniform, 21, world_rank()),
        std::vector<float>(kParams));
  for (std::int64_t s = 1; s <= 3; ++s) {
    put(r.grads, values(uniform, 21 + static_cast<std::uint64_t>(s), r.rank()));
    r.algorithm->step(s, 0.05f);
    r.algorithm->after_step(s);
  }
  const auto params_mean = mean_of(allgather(r.params));
  const auto momentum_mean = mean_of(allgather(r.state("momentum")));
  r.algorithm->consensus();
  const auto momentum = r.state("momentum");
  expect_averaged(r.params, params_mean, momentum, momentum_mean);
  // The estimates were rebuilt from the equal models: a round changes nothing.
  const auto before = r.params;
  r.algorithm->after_step(4);
  expect_close(
      r.params, [&](std::size_t i) { return before[i]; }, [](std::size_t) { return 1e-6; },
      "a round after consensus");
}

// ---- async -----------------------------------------------------------------------------------------------

TEST(Async, BackgroundRoundsAverageTheModels) {
  // No local steps: the model a round copies is still the model when its average is applied, so after
  // the first round every rank holds the average of the initial models.
  auto o = named("async");
  o.sync_interval_ms = 1;
  const int n = world_size();
  Rig r(o, sgd(0), values(uniform, 41, world_rank()), std::vector<float>(kParams));
  std::vector<std::vector<float>> models;
  for (int k = 0; k < n; ++k) models.push_back(values(uniform, 41, k));
  const auto mean = mean_of(models);
  auto at_mean = [&] {
    for (std::size_t i = 0; i < kParams; ++i) {
      if (std::abs(r.params[i] - mean[i]) > 2e-6) return false;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  bool averaged = false;
  for (std::int64_t s = 1; !averaged && std::chrono::steady_clock::now() < deadline; ++s) {
    r.algorithm->after_step(s);
    averaged = at_mean();
    std::this_thread::sleep_for(1ms);
  }
  // Every rank reaches consensus() (the agreed stop) before any assertion can return early.
  r.algorithm->consensus();
  EXPECT_TRUE(averaged) << "no background round was applied within 20 s";
  EXPECT_TRUE(at_mean());
  expect_same_on_every_rank(r.params, "parameters");
  EXPECT_GT(r.algorithm->take_bytes_sent(), 0u);
}

TEST(Async, ConsensusAfterLocalStepsIsTheAverage) {
  auto o = named("async");
  o.sync_interval_ms = 2;
  Rig r(o, sgd(0.9f), values(uniform, 43, world_rank()), std::vector<float>(kParams));
  for (std::int64_t s = 1; s <= 10; ++s) {
    put(r.grads, values(uniform, 43 + static_cast<std::uint64_t>(s), r.rank()));
    r.algorithm->step(s, 0.05f);
    r.algorithm->after_step(s);
    std::this_thread::sleep_for(1ms);
  }
  // The background thread never writes the parameters, so what consensus() averages is what the ranks
  // hold now (the thread is stopped first).
  const auto params_mean = mean_of(allgather(r.params));
  const auto momentum_mean = mean_of(allgather(r.state("momentum")));
  r.algorithm->consensus();
  const auto momentum = r.state("momentum");
  expect_averaged(r.params, params_mean, momentum, momentum_mean);
}
