// The ring backend (comm/ring/) and ByteGrad's compressed allreduce and reduce-scatter (algo/, at 8, 4 and
// 2 bits): against MPI_Allreduce and the exact sum, bitwise agreement across ranks (across a block's
// holders), the documented error bound, error-feedback accounting, wire bytes, delegation of what the ring
// does not do, deadlines when a rank is missing, and abort().
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "sinew/algo/collectives.hpp"
#include "sinew/algo/quantize.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/comm/ring/backend.hpp"
#include "sinew/core/error.hpp"

using namespace sinew;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kSeg = comm::ring::kSegmentBytes / sizeof(float);  // floats per ring message

comm::mpi::MpiBackend make() { return comm::mpi::MpiBackend(mpi::Communicator::borrow(MPI_COMM_WORLD)); }

/// Rank `rank`'s input element `i` for `seed`, in [-1, 1): every rank can compute every rank's input.
float input(std::uint64_t seed, int rank, std::size_t i) {
  std::uint64_t z =
      seed * 0x9E3779B97F4A7C15ULL + static_cast<std::uint64_t>(rank) * 0xBF58476D1CE4E5B9ULL + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;  // splitmix64's finaliser
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.f;
}

std::vector<float> inputs(std::uint64_t seed, int rank, std::size_t count) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = input(seed, rank, i);
  return v;
}

std::vector<double> exact_sum(std::uint64_t seed, int ranks, std::size_t count) {
  std::vector<double> s(count, 0.0);
  for (int k = 0; k < ranks; ++k) {
    for (std::size_t i = 0; i < count; ++i) s[i] += input(seed, k, i);
  }
  return s;
}

/// Rank 0's values must equal this rank's bit for bit.
void expect_bitwise_equal_to_rank0(comm::Backend& b, const std::vector<float>& v) {
  std::vector<float> root = v;
  b.broadcast_sync(comm::Buffer::of(std::span<float>(root)), 0);
  EXPECT_TRUE(v.empty() || std::memcmp(root.data(), v.data(), v.size() * sizeof(float)) == 0)
      << "rank " << b.rank() << " differs from rank 0 (" << v.size() << " elements)";
}

std::vector<std::size_t> sizes(int n) {
  const auto un = static_cast<std::size_t>(n);
  return {0, 1, un - 1, un, un + 1, 1001, 3 * (kSeg + 5), std::size_t{1} << 20};
}

/// The ring's sum of `v` over the group.
void ring_sum(comm::ring::RingBackend& ring, std::vector<float>& v, const comm::Options& o = {}) {
  ring.allreduce_sync(comm::Buffer::of(std::span<float>(v)), comm::ReduceOp::kSum, o);
}

}  // namespace

TEST(RingBackend, MatchesMpiAllreduceAndIsBitwiseEqualOnAllRanks) {
  auto b = make();
  comm::ring::RingBackend ring(b);
  EXPECT_EQ(ring.name(), "ring");
  EXPECT_EQ(ring.rank(), b.rank());
  EXPECT_EQ(ring.size(), b.size());
  const int n = b.size();
  for (const bool blocking : {false, true}) {
    for (const std::size_t count : sizes(n)) {
      SCOPED_TRACE(testing::Message()
                   << "count " << count << (blocking ? " allreduce_blocking" : " allreduce"));
      auto v = inputs(count, b.rank(), count);
      auto ref = v;
      if (blocking) {
        ring.allreduce_blocking(comm::Buffer::of(std::span<float>(v)), comm::ReduceOp::kSum);
      } else {
        ring_sum(ring, v);
      }
      b.allreduce_sync(comm::Buffer::of(std::span<float>(ref)), comm::ReduceOp::kSum);
      const auto exact = exact_sum(count, n, count);
      const float tol =
          4 * static_cast<float>(n) * std::numeric_limits<float>::epsilon() * static_cast<float>(n);
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_NEAR(v[i], ref[i], 2 * tol) << i;
        ASSERT_NEAR(v[i], exact[i], tol) << i;
      }
      expect_bitwise_equal_to_rank0(b, v);
    }
  }
}

TEST(RingBackend, SendsTwoNMinusOneOverNOfTheBuffer) {
  auto b = make();
  const int n = b.size();
  const std::size_t per_block = 100003;  // two segments per block, the second one short
  const std::size_t count = per_block * static_cast<std::size_t>(n);
  std::vector<float> v(count, 1.f);
  comm::CommStats s;
  comm::ring::RingBackend ring(b, &s);
  ring_sum(ring, v);
  EXPECT_EQ(s.bytes_sent, 2 * static_cast<std::uint64_t>(n - 1) * per_block * sizeof(float));
  const std::uint64_t segments = (per_block + kSeg - 1) / kSeg;
  EXPECT_EQ(s.messages_sent, 2 * static_cast<std::uint64_t>(n - 1) * segments);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [&](float x) { return x == static_cast<float>(n); }));
  ring_sum(ring, v);  // stats accumulate over calls
  EXPECT_EQ(s.bytes_sent, 4 * static_cast<std::uint64_t>(n - 1) * per_block * sizeof(float));
}

TEST(RingBackend, TestAdvancesTheRingUntilItCompletes) {
  auto b = make();
  comm::ring::RingBackend ring(b);
  const std::size_t count = 5 * kSeg + 3;
  auto v = inputs(7, b.rank(), count);
  auto ref = v;
  auto w = ring.allreduce(comm::Buffer::of(std::span<float>(v)), comm::ReduceOp::kSum, {});
  const auto t0 = std::chrono::steady_clock::now();
  while (!w->test()) ASSERT_LT(std::chrono::steady_clock::now() - t0, 30s);
  EXPECT_TRUE(w->test());  // stays complete
  w->wait(1s);
  b.allreduce_sync(comm::Buffer::of(std::span<float>(ref)), comm::ReduceOp::kSum);
  const float tol =
      8 * static_cast<float>(b.size()) * std::numeric_limits<float>::epsilon() * static_cast<float>(b.size());
  for (std::size_t i = 0; i < count; ++i) ASSERT_NEAR(v[i], ref[i], tol) << i;
}

TEST(RingBackend, DelegatesWhatTheRingDoesNotDo) {
  auto b = make();
  comm::CommStats s;
  comm::ring::RingBackend ring(b, &s);
  const int r = b.rank(), n = b.size();
  // Other element types and reductions are the inner backend's allreduce.
  std::vector<double> d(101);
  std::iota(d.begin(), d.end(), static_cast<double>(r));
  ring.allreduce_sync(comm::Buffer::of(std::span<double>(d)), comm::ReduceOp::kSum);
  for (std::size_t i = 0; i < d.size(); ++i) ASSERT_EQ(d[i], n * static_cast<double>(i) + n * (n - 1) / 2.0);
  float mx = static_cast<float>(r);
  ring.allreduce_sync(comm::Buffer::of(std::span<float>(&mx, 1)), comm::ReduceOp::kMax);
  EXPECT_EQ(mx, static_cast<float>(n - 1));
  std::int64_t mn = r + 1;
  ring.allreduce_blocking(comm::Buffer::of(std::span<std::int64_t>(&mn, 1)), comm::ReduceOp::kMin);
  EXPECT_EQ(mn, 1);
  EXPECT_EQ(s.bytes_sent, 0u) << "only the ring's own messages are counted";
  // Everything else too.
  std::vector<std::int32_t> bc(5, r == 0 ? 42 : -1);
  ring.broadcast_sync(comm::Buffer::of(std::span<std::int32_t>(bc)), 0);
  for (auto x : bc) ASSERT_EQ(x, 42);
  std::vector<float> in(2, static_cast<float>(r)), out(2 * static_cast<std::size_t>(n));
  ring.allgather_sync(comm::Buffer::of(std::span<float>(in)), comm::Buffer::of(std::span<float>(out)));
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<float>(i / 2));
  std::int64_t send = r, recv = -1;
  comm::Options o;
  o.tag = 5;
  auto rw = ring.recv(comm::Buffer::of(std::span<std::int64_t>(&recv, 1)), (r + n - 1) % n, o);
  auto sw = ring.send(comm::Buffer::of(std::span<std::int64_t>(&send, 1)), (r + 1) % n, o);
  rw->wait(30s);
  sw->wait(30s);
  EXPECT_EQ(recv, (r + n - 1) % n);
  ring.barrier_sync();
}

TEST(RingBackend, BlockOfSplitsEvenly) {
  const comm::ring::Block a = comm::ring::block_of(10, 3, 0), c = comm::ring::block_of(10, 3, 2);
  EXPECT_EQ(a.offset, 0u);
  EXPECT_EQ(a.count, 4u);
  EXPECT_EQ(c.offset, 7u);
  EXPECT_EQ(c.count, 3u);
  EXPECT_EQ(comm::ring::block_of(2, 4, 3).count, 0u);
  EXPECT_THROW((void)comm::ring::block_of(10, 3, 3), InvalidArgument);
}

/// compressed_allreduce at 8, 4 and 2 bits per element.
class CompressedAllreduceBits : public testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Widths, CompressedAllreduceBits, testing::Values(8, 4, 2),
                         [](const testing::TestParamInfo<int>& p) {
                           return "Bits" + std::to_string(p.param);
                         });

TEST_P(CompressedAllreduceBits, WithinTheDocumentedBoundAndBitwiseEqualOnAllRanks) {
  auto b = make();
  const int n = b.size(), bits = GetParam();
  // The smallest chunk the width allows (8 / bits elements: one byte of codes), and larger ones. The
  // blocks of sizes(n) have every length, odd ones too: each is a complete encoding of its own.
  const auto smallest = static_cast<std::size_t>(8 / bits);
  for (const std::size_t chunk : {smallest, std::size_t{64}, std::size_t{1000}}) {
    for (const std::size_t count : sizes(n)) {
      SCOPED_TRACE(testing::Message() << "count " << count << " chunk " << chunk << " bits " << bits);
      const std::uint64_t seed = count * 7 + chunk;
      auto v = inputs(seed, b.rank(), count);
      algo::compressed_allreduce(b, v, chunk, {}, {}, nullptr, bits);
      const auto exact = exact_sum(seed, n, count);
      // The header's bound, (2n - 1) R / (2 (2^bits - 2)), with each rank's whole-buffer range (>= every
      // chunk's range): inputs are in [-1, 1), so each rank's range is below 2 and the sum's below 2n. The
      // 1 % covers the step's rounding up (a factor 1 + 2^-15) and the sum's rounding. The bound is nearly
      // tight: at 2 bits, 2 ranks, chunks of 1000, the worst error is 0.99 of it.
      const auto steps2 = static_cast<float>(2 * ((1 << bits) - 2));  // 508, 28, 4
      const float bound = (2.f * static_cast<float>(n - 1) + 2.f * static_cast<float>(n)) / steps2 * 1.01f +
                          1e-5f * static_cast<float>(n);
      double worst = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const double err = std::abs(v[i] - exact[i]);
        ASSERT_LE(err, bound) << i;
        worst = std::max(worst, err);
      }
      // Chunks of one element (8 bits) are constant and travel exactly; larger ones must have been
      // quantised.
      if (chunk > 1 && count >= 1000) {
        EXPECT_GT(worst, 1e-4);
      }
      expect_bitwise_equal_to_rank0(b, v);
    }
  }
}

TEST_P(CompressedAllreduceBits, ErrorFeedbackLosesNothingOverSteps) {
  auto b = make();
  const int n = b.size(), bits = GetParam();
  const std::size_t count = 10007, chunk = 256;
  constexpr int kSteps = 6;
  std::vector<float> residual(count, 0.f);
  std::vector<double> outputs(count, 0.0), inputs_sum(count, 0.0);
  for (int t = 0; t < kSteps; ++t) {
    const auto seed = 1000 + static_cast<std::uint64_t>(t);
    auto v = inputs(seed, b.rank(), count);
    algo::compressed_allreduce(b, v, chunk, residual, {}, nullptr, bits);
    expect_bitwise_equal_to_rank0(b, v);
    const auto exact = exact_sum(seed, n, count);
    for (std::size_t i = 0; i < count; ++i) {
      outputs[i] += v[i];
      inputs_sum[i] += exact[i];
    }
  }
  EXPECT_GT(*std::max_element(residual.begin(), residual.end()), 1e-4f) << "nothing was quantised away";
  std::vector<double> residuals(residual.begin(), residual.end());
  b.allreduce_sync(comm::Buffer::of(std::span<double>(residuals)), comm::ReduceOp::kSum);
  // Outputs plus what the ranks still hold back equal the inputs, up to float rounding; the outputs
  // alone are off by the quantisation error, orders of magnitude more.
  const double tol = 1e-6 * kSteps * n;  // measured at 4 ranks: below 5e-7 at 8 and 4 bits, 1e-6 at 2
  double outputs_only = 0;
  for (std::size_t i = 0; i < count; ++i) {
    ASSERT_NEAR(outputs[i] + residuals[i], inputs_sum[i], tol) << i;
    outputs_only = std::max(outputs_only, std::abs(outputs[i] - inputs_sum[i]));
  }
  EXPECT_GT(outputs_only, 100 * tol);
}

TEST_P(CompressedAllreduceBits, SendsBitsOver32OfTheRingsBytes) {
  auto b = make();
  const int n = b.size(), bits = GetParam();
  const std::size_t per_block = 65536, chunk = 1024;
  const std::size_t count = per_block * static_cast<std::size_t>(n);
  std::vector<float> v = inputs(5, b.rank(), count);
  algo::CommStats ring, bytegrad;
  comm::ring::RingBackend ring_backend(b, &ring);
  ring_sum(ring_backend, v);
  v = inputs(5, b.rank(), count);
  algo::compressed_allreduce(b, v, chunk, {}, {}, &bytegrad, bits);
  // n-1 blocks out in the scatter, our reduced block to n-1 ranks in the allgather.
  EXPECT_EQ(bytegrad.bytes_sent,
            2 * static_cast<std::uint64_t>(n - 1) * algo::encoded_bytes(per_block, chunk, bits));
  EXPECT_EQ(bytegrad.messages_sent, 2 * static_cast<std::uint64_t>(n - 1));
  const double ratio = static_cast<double>(bytegrad.bytes_sent) / static_cast<double>(ring.bytes_sent);
  EXPECT_GT(ratio, bits / 32.0);         // a quarter, an eighth, a sixteenth
  EXPECT_LT(ratio, bits / 32.0 + 0.01);  // plus 8 bytes per 1024-element chunk
}

TEST(CompressedAllreduce, RejectsBadArguments) {
  auto b = make();
  std::vector<float> v(100, 1.f), short_residual(99, 0.f);
  EXPECT_THROW(algo::compressed_allreduce(b, v, 0, {}, {}), InvalidArgument);
  EXPECT_THROW(algo::compressed_allreduce(b, v, 16, short_residual, {}), InvalidArgument);
  for (const int bits : {0, 1, 3, 16}) {
    EXPECT_THROW(algo::compressed_allreduce(b, v, 16, {}, {}, nullptr, bits), InvalidArgument) << bits;
  }
  EXPECT_THROW(algo::compressed_allreduce(b, v, 3, {}, {}, nullptr, 4), InvalidArgument);
  EXPECT_THROW(algo::compressed_allreduce(b, v, 6, {}, {}, nullptr, 2), InvalidArgument);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.f; }))
      << "rejected calls change nothing";
}

namespace {

/// Uneven blocks over n ranks, one of them empty where n > 2 (a bucket that misses a shard): block k has
/// `base` * (k + 1) elements, block 1 none.
std::vector<std::size_t> uneven_blocks(int n, std::size_t base) {
  std::vector<std::size_t> c(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) c[static_cast<std::size_t>(k)] = (n > 2 && k == 1) ? 0 : base * (k + 1);
  return c;
}

/// Sharded gradients' receivers with two holders per shard: shard k also goes to rank k + 1 (mod n).
bool next_holds(int k, int q, int n) { return n > 1 && q == (k + 1) % n; }

/// Whether n floats at a and at b hold the same bits.
bool same_bits(const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  }
  return true;
}

}  // namespace

TEST_P(CompressedAllreduceBits, ReduceScatterOverEvenBlocksToEveryRankIsTheAllreduce) {
  // The allreduce is the reduce-scatter whose blocks are the ring's and whose every block goes to
  // every rank: the two must agree bit for bit, residuals included.
  auto b = make();
  const int n = b.size(), bits = GetParam();
  const std::size_t count = 4099, chunk = 64;
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) counts[static_cast<std::size_t>(k)] = comm::ring::block_of(count, n, k).count;
  auto a = inputs(11, b.rank(), count), s = a;
  std::vector<float> res_a(count, 0.f), res_s(count, 0.f);
  for (int step = 0; step < 3; ++step) {
    algo::compressed_allreduce(b, a, chunk, res_a, {}, nullptr, bits);
    algo::compressed_reduce_scatter(
        b, s, counts, [](int, int) { return true; }, chunk, res_s, {}, nullptr, bits);
    ASSERT_TRUE(same_bits(a.data(), s.data(), count)) << "step " << step;
    ASSERT_TRUE(same_bits(res_a.data(), res_s.data(), count)) << "step " << step;
  }
}

TEST_P(CompressedAllreduceBits, ReduceScatterGivesEachBlockToItsHoldersOnly) {
  auto b = make();
  const int n = b.size(), r = b.rank(), bits = GetParam();
  const std::size_t chunk = 64;
  const auto counts = uneven_blocks(n, 1000 + 3);  // odd lengths: each block a complete encoding
  const std::size_t count = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  const auto gets = [n](int k, int q) { return next_holds(k, q, n); };
  const auto in = inputs(21, r, count);
  auto v = in;
  algo::CommStats stats;
  algo::compressed_reduce_scatter(b, v, counts, gets, chunk, {}, {}, &stats, bits);
  const auto exact = exact_sum(21, n, count);
  const auto steps2 = static_cast<float>(2 * ((1 << bits) - 2));
  const float bound = (2.f * static_cast<float>(n - 1) + 2.f * static_cast<float>(n)) / steps2 * 1.01f +
                      1e-5f * static_cast<float>(n);
  std::uint64_t expect_bytes = 0;
  std::size_t at = 0;
  for (int k = 0; k < n; ++k) {
    const std::size_t c = counts[static_cast<std::size_t>(k)];
    SCOPED_TRACE(testing::Message() << "block " << k << " of " << c << " at rank " << r);
    // The owner's reduced block, as every holder must have it.
    std::vector<float> owner(v.begin() + static_cast<std::ptrdiff_t>(at),
                             v.begin() + static_cast<std::ptrdiff_t>(at + c));
    b.broadcast_sync(comm::Buffer::of(std::span<float>(owner)), k);
    if (k == r || gets(k, r)) {
      for (std::size_t i = 0; i < c; ++i) ASSERT_LE(std::abs(v[at + i] - exact[at + i]), bound) << i;
      EXPECT_TRUE(c == 0 || same_bits(owner.data(), v.data() + at, c))
          << "a holder's block differs from its owner's";
      if (c >= 1000 && n > 1) {
        double worst = 0;
        for (std::size_t i = 0; i < c; ++i) worst = std::max(worst, std::abs(v[at + i] - exact[at + i]));
        EXPECT_GT(worst, 1e-4) << "nothing was quantised";
      }
    } else {
      EXPECT_TRUE(c == 0 || same_bits(in.data() + at, v.data() + at, c))
          << "a block this rank does not hold changed";
    }
    if (k != r) expect_bytes += algo::encoded_bytes(c, chunk, bits);  // its contribution to block k
    at += c;
  }
  // Its own reduced block once to its one other holder.
  if (n > 1) expect_bytes += algo::encoded_bytes(counts[static_cast<std::size_t>(r)], chunk, bits);
  std::uint64_t nonempty_out = 0;
  for (int k = 0; k < n; ++k) nonempty_out += (k != r && counts[static_cast<std::size_t>(k)] > 0) ? 1 : 0;
  EXPECT_EQ(stats.bytes_sent, expect_bytes);
  EXPECT_EQ(stats.messages_sent, nonempty_out + (n > 1 && counts[static_cast<std::size_t>(r)] > 0 ? 1 : 0));
}

TEST_P(CompressedAllreduceBits, ReduceScatterErrorFeedbackLosesNothingOverSteps) {
  // Per block, over steps: the owner's reduced values plus every rank's residual of that block equal the
  // inputs' sum, up to float rounding.
  auto b = make();
  const int n = b.size(), r = b.rank(), bits = GetParam();
  constexpr int kSteps = 20;
  const auto counts = uneven_blocks(n, 997);
  const std::size_t count = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<float> residual(count, 0.f);
  std::vector<double> owned_outputs(count, 0.0), inputs_sum(count, 0.0);
  std::size_t own_at = 0;
  for (int k = 0; k < r; ++k) own_at += counts[static_cast<std::size_t>(k)];
  const std::size_t own_count = counts[static_cast<std::size_t>(r)];
  for (int step = 0; step < kSteps; ++step) {
    const std::uint64_t seed = 300 + static_cast<std::uint64_t>(step);
    auto v = inputs(seed, r, count);
    algo::compressed_reduce_scatter(
        b, v, counts, [n](int k, int q) { return next_holds(k, q, n); }, 128, residual, {}, nullptr, bits);
    const auto exact = exact_sum(seed, n, count);
    for (std::size_t i = 0; i < count; ++i) inputs_sum[i] += exact[i];
    for (std::size_t i = own_at; i < own_at + own_count; ++i) owned_outputs[i] += v[i];
  }
  // Every block's owner contributes its outputs; every rank its residuals.
  std::vector<double> total(count, 0.0);
  for (std::size_t i = 0; i < count; ++i) total[i] = owned_outputs[i] + residual[i];
  b.allreduce_sync(comm::Buffer::of(std::span<double>(total)), comm::ReduceOp::kSum);
  const double tol = 1e-6 * kSteps * n;
  for (std::size_t i = 0; i < count; ++i) ASSERT_NEAR(total[i], inputs_sum[i], tol) << i;
}

TEST(CompressedAllreduce, ReduceScatterRejectsBlocksThatDoNotFit) {
  auto b = make();
  const int n = b.size();
  std::vector<float> v(100, 1.f);
  const auto all = [](int, int) { return true; };
  std::vector<std::size_t> too_few(static_cast<std::size_t>(n) + 1, 0);
  too_few[0] = 100;
  EXPECT_THROW(algo::compressed_reduce_scatter(b, v, too_few, all, 16, {}, {}), InvalidArgument);
  std::vector<std::size_t> short_cover(static_cast<std::size_t>(n), 0);
  short_cover[0] = 99;
  EXPECT_THROW(algo::compressed_reduce_scatter(b, v, short_cover, all, 16, {}, {}), InvalidArgument);
  EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 1.f; }))
      << "rejected calls change nothing";
}

TEST(Collectives, AMissingRankIsATimeoutNotAHang) {
  // Rank 0 stays away: everyone else must give up at the deadline with Timeout.
  for (const bool compressed : {false, true}) {
    SCOPED_TRACE(compressed ? "compressed" : "ring");
    {
      auto b = make();  // a fresh communicator: the messages left behind never reach later tests
      if (b.rank() != 0) {
        std::vector<float> v(std::size_t{1} << 18, 1.f);  // large enough for rendezvous sends
        comm::Options o;
        o.timeout = 300ms;
        const auto t0 = std::chrono::steady_clock::now();
        if (compressed) {
          EXPECT_THROW(algo::compressed_allreduce(b, v, 1024, {}, o), Timeout);
        } else {
          comm::ring::RingBackend ring(b);
          EXPECT_THROW(ring_sum(ring, v, o), Timeout);
        }
        const auto waited = std::chrono::steady_clock::now() - t0;
        EXPECT_GE(waited, 300ms);
        EXPECT_LT(waited, 5s);
      }
      MPI_Barrier(MPI_COMM_WORLD);
    }
  }
}

TEST(RingBackend, AbortEndsARingThatCannotFinish) {
  // Rank 0 stays away: the others' ring cannot complete. abort() (here from another thread, as a
  // watchdog would) ends the wait with CommFailure long before its deadline, and the backend refuses work.
  {
    auto b = make();  // a fresh communicator: the messages left behind never reach later tests
    if (b.rank() != 0) {
      comm::ring::RingBackend ring(b);
      std::vector<float> v(std::size_t{1} << 18, 1.f);
      auto w = ring.allreduce(comm::Buffer::of(std::span<float>(v)), comm::ReduceOp::kSum, {});
      const auto t0 = std::chrono::steady_clock::now();
      std::thread aborter([&] {
        std::this_thread::sleep_for(100ms);
        w->abort();
      });
      EXPECT_THROW(w->wait(60s), CommFailure);
      aborter.join();
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
      EXPECT_TRUE(ring.aborted());
      EXPECT_THROW(ring_sum(ring, v), CommFailure);
      w->abort();  // idempotent
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST(RingBackend, AbortOfTheBackendEndsABlockingRing) {
  // allreduce_blocking has no deadline of its own: the backend's abort() from another thread ends it.
  {
    auto b = make();
    if (b.rank() != 0) {
      comm::ring::RingBackend ring(b);
      std::vector<float> v(1000, 1.f);
      const auto t0 = std::chrono::steady_clock::now();
      std::thread aborter([&] {
        std::this_thread::sleep_for(100ms);
        ring.abort();
      });
      EXPECT_THROW(ring.allreduce_blocking(comm::Buffer::of(std::span<float>(v)), comm::ReduceOp::kSum),
                   CommFailure);
      aborter.join();
      EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
}
