// DistributedSampler: exactly-once coverage per epoch at any world size (also when it changes mid-epoch),
// reproducible permutations, and the equivalence W ranks x b == 1 rank x W*b.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/data/sampler.hpp"

namespace sinew::data {
namespace {

std::vector<std::size_t> iota_vector(std::size_t n) {
  std::vector<std::size_t> v(n);
  std::iota(v.begin(), v.end(), std::size_t{0});
  return v;
}

// Runs one step at world size w: peeks every rank, checks the rank sizes against the contract, appends
// the samples to `seen` in rank order and advances. Returns the step's global count.
std::size_t run_step(DistributedSampler& s, int w, std::size_t b, std::vector<std::size_t>& seen) {
  const std::size_t remaining = s.dataset_size() - s.cursor();
  const std::size_t expected_global = std::min(static_cast<std::size_t>(w) * b, remaining);
  std::size_t global = 0;
  for (int r = 0; r < w; ++r) {
    const DistributedSampler::Batch batch = s.peek(r, w, b);
    EXPECT_EQ(batch.global_count, expected_global);
    const std::size_t expected_count =
        expected_global / static_cast<std::size_t>(w) +
        (static_cast<std::size_t>(r) < expected_global % static_cast<std::size_t>(w) ? 1 : 0);
    EXPECT_EQ(batch.indices.size(), expected_count) << "rank " << r << " of " << w;
    EXPECT_LE(batch.indices.size(), b);
    seen.insert(seen.end(), batch.indices.begin(), batch.indices.end());
    global = batch.global_count;
  }
  s.advance(global);
  return global;
}

TEST(Sampler, ExactlyOncePerEpochAcrossRanks) {
  for (const std::size_t n : {1UL, 7UL, 100UL, 101UL, 997UL}) {
    for (const int w : {1, 2, 3, 4, 7}) {
      for (const std::size_t b : {1UL, 3UL, 8UL, 32UL}) {
        for (const std::uint64_t seed : {1ULL, 2ULL, 12345ULL}) {
          DistributedSampler s(n, seed);
          for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
            s.start_epoch(epoch);
            const std::size_t planned = s.steps_left(w, b);
            std::vector<std::size_t> seen;
            std::size_t steps = 0;
            while (!s.epoch_done()) {
              ASSERT_EQ(s.steps_left(w, b), planned - steps);
              run_step(s, w, b, seen);
              ++steps;
              ASSERT_LE(steps, n) << "no progress";
            }
            EXPECT_EQ(steps, planned);
            EXPECT_EQ(s.steps_left(w, b), 0U);
            EXPECT_EQ(s.peek(0, w, b).global_count, 0U);
            // In permutation order, so the union is the permutation itself, and sorted it is [0, n).
            EXPECT_TRUE(std::equal(seen.begin(), seen.end(), s.permutation().begin(), s.permutation().end()));
            std::sort(seen.begin(), seen.end());
            ASSERT_EQ(seen, iota_vector(n)) << "n=" << n << " w=" << w << " b=" << b << " seed=" << seed;
          }
        }
      }
    }
  }
}

TEST(Sampler, PermutationsDependOnSeedAndEpoch) {
  const std::size_t n = 1000;
  DistributedSampler a(n, 7), b(n, 7), c(n, 8);
  const std::vector<std::size_t> a0(a.permutation().begin(), a.permutation().end());
  EXPECT_TRUE(std::equal(a0.begin(), a0.end(), b.permutation().begin()));   // same seed, same permutation
  EXPECT_FALSE(std::equal(a0.begin(), a0.end(), c.permutation().begin()));  // other seed
  EXPECT_NE(a0, iota_vector(n));
  std::vector<std::size_t> sorted = a0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota_vector(n));

  a.start_epoch(1);
  const std::vector<std::size_t> a1(a.permutation().begin(), a.permutation().end());
  EXPECT_NE(a1, a0);  // other epoch
  a.start_epoch(0);   // back to epoch 0: the same permutation again
  EXPECT_TRUE(std::equal(a0.begin(), a0.end(), a.permutation().begin()));
  b.start_epoch(5);
  a.start_epoch(5);
  EXPECT_TRUE(std::equal(a.permutation().begin(), a.permutation().end(), b.permutation().begin()));
}

TEST(Sampler, PermutationIsPinned) {
  // The shuffle is part of the reproducibility contract (same on every platform and standard library).
  const DistributedSampler s(10, 1);
  EXPECT_TRUE(std::equal(s.permutation().begin(), s.permutation().end(),
                         std::vector<std::size_t>{3, 0, 8, 6, 7, 4, 5, 1, 2, 9}.begin()));
}

TEST(Sampler, IdentityWithoutShuffle) {
  DistributedSampler s(10, 99, /*shuffle=*/false);
  EXPECT_FALSE(s.shuffle());
  EXPECT_TRUE(std::equal(s.permutation().begin(), s.permutation().end(), iota_vector(10).begin()));
  s.start_epoch(3);
  EXPECT_TRUE(std::equal(s.permutation().begin(), s.permutation().end(), iota_vector(10).begin()));
  EXPECT_EQ(s.peek(1, 2, 3).indices, (std::vector<std::size_t>{3, 4, 5}));
}

TEST(Sampler, LastStepSpreadsRemainder) {
  // n = 10, W = 3, b = 2: steps of 6 then 4; the 4 are dealt 2, 1, 1.
  DistributedSampler s(10, 1, /*shuffle=*/false);
  EXPECT_EQ(s.steps_left(3, 2), 2U);
  EXPECT_EQ(s.peek(2, 3, 2).indices, (std::vector<std::size_t>{4, 5}));
  s.advance(6);
  EXPECT_EQ(s.steps_left(3, 2), 1U);
  EXPECT_EQ(s.peek(0, 3, 2).indices, (std::vector<std::size_t>{6, 7}));
  EXPECT_EQ(s.peek(1, 3, 2).indices, (std::vector<std::size_t>{8}));
  EXPECT_EQ(s.peek(2, 3, 2).indices, (std::vector<std::size_t>{9}));
  EXPECT_EQ(s.peek(2, 3, 2).global_count, 4U);
  // A rank may get nothing: 1 sample left, 4 ranks.
  s.advance(3);
  EXPECT_EQ(s.peek(0, 4, 5).indices, (std::vector<std::size_t>{9}));
  EXPECT_TRUE(s.peek(1, 4, 5).indices.empty());
  EXPECT_TRUE(s.peek(3, 4, 5).indices.empty());
  EXPECT_EQ(s.peek(3, 4, 5).global_count, 1U);
  s.advance(1);
  EXPECT_TRUE(s.epoch_done());
  EXPECT_EQ(s.steps_left(4, 5), 0U);
  // Huge batches do not overflow.
  s.start_epoch(1);
  EXPECT_EQ(s.steps_left(7, SIZE_MAX / 2), 1U);
  EXPECT_EQ(s.peek(6, 7, SIZE_MAX / 2).global_count, 10U);
}

TEST(Sampler, RanksConcatenateToSingleRankStep) {
  for (const int w : {1, 2, 3, 4, 7}) {
    for (const std::size_t b : {1UL, 5UL, 16UL}) {
      for (const std::size_t n : {50UL, 333UL}) {
        DistributedSampler multi(n, 4242), single(n, 4242);
        const std::size_t wb = static_cast<std::size_t>(w) * b;
        while (!single.epoch_done()) {
          std::vector<std::size_t> concat;
          for (int r = 0; r < w; ++r) {
            const auto batch = multi.peek(r, w, b);
            concat.insert(concat.end(), batch.indices.begin(), batch.indices.end());
          }
          const auto one = single.peek(0, 1, wb);
          ASSERT_EQ(concat, one.indices)
              << "w=" << w << " b=" << b << " n=" << n << " cursor=" << single.cursor();
          ASSERT_EQ(multi.peek(0, w, b).global_count, one.global_count);
          multi.advance(one.global_count);
          single.advance(one.global_count);
        }
        EXPECT_TRUE(multi.epoch_done());
      }
    }
  }
}

TEST(Sampler, ResizeMidEpochKeepsExactlyOnce) {
  Rng rng(2024);
  for (int trial = 0; trial < 50; ++trial) {
    const std::size_t n = 1 + rng.uniform_below(500);
    DistributedSampler s(n, rng.next());
    s.start_epoch(static_cast<std::int64_t>(rng.uniform_below(10)));
    std::vector<std::size_t> seen;
    while (!s.epoch_done()) {
      const int w = 1 + static_cast<int>(rng.uniform_below(8));
      const std::size_t b = 1 + rng.uniform_below(20);
      run_step(s, w, b, seen);
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(seen, iota_vector(n)) << "trial " << trial;
  }
}

TEST(Sampler, SetPositionRestores) {
  DistributedSampler original(500, 11);
  original.start_epoch(3);
  std::vector<std::size_t> ignored;
  run_step(original, 4, 16, ignored);
  run_step(original, 4, 16, ignored);
  EXPECT_EQ(original.epoch(), 3);
  EXPECT_EQ(original.cursor(), 128U);

  // A restored sampler continues identically, here at another world size.
  DistributedSampler restored(500, 11);
  restored.set_position(original.epoch(), original.cursor());
  EXPECT_EQ(restored.epoch(), 3);
  EXPECT_EQ(restored.cursor(), 128U);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(restored.peek(r, 3, 10).indices, original.peek(r, 3, 10).indices);

  restored.set_position(3, 500);
  EXPECT_TRUE(restored.epoch_done());
  EXPECT_THROW(restored.set_position(3, 501), InvalidArgument);
  EXPECT_THROW(restored.set_position(-1, 0), InvalidArgument);
}

TEST(Sampler, InvalidArguments) {
  EXPECT_THROW(DistributedSampler(0, 1), InvalidArgument);
  DistributedSampler s(10, 1);
  EXPECT_THROW((void)s.peek(2, 2, 1), InvalidArgument);
  EXPECT_THROW((void)s.peek(-1, 2, 1), InvalidArgument);
  EXPECT_THROW((void)s.peek(0, 0, 1), InvalidArgument);
  EXPECT_THROW((void)s.peek(0, 1, 0), InvalidArgument);
  EXPECT_THROW((void)s.steps_left(0, 1), InvalidArgument);
  EXPECT_THROW(s.advance(11), InvalidArgument);
  s.advance(10);
  EXPECT_THROW(s.advance(1), InvalidArgument);
  EXPECT_THROW(s.start_epoch(-2), InvalidArgument);
  EXPECT_EQ(s.dataset_size(), 10U);
  EXPECT_EQ(s.seed(), 1U);
}

}  // namespace
}  // namespace sinew::data

namespace sinew::data {
// Gradient accumulation (--global-batch) takes a step as several ranges: together they are exactly the
// step's samples, dealt out as peek() would, and a range past the epoch's end is refused.
TEST(Sampler, PeekRangeCoversAccumulatedStep) {
  DistributedSampler s(1000, 5);
  s.start_epoch(2);
  s.advance(100);
  const int w = 3;
  const std::size_t micro = 3 * 8, total = 50;  // 50 samples in micro-batches of 24: 24 + 24 + 2
  std::vector<std::size_t> got;
  for (std::size_t off = 0; off < total; off += micro) {
    for (int r = 0; r < w; ++r) {
      const auto b = s.peek_range(r, w, off, std::min(micro, total - off));
      got.insert(got.end(), b.indices.begin(), b.indices.end());
    }
  }
  const auto perm = s.permutation();
  std::vector<std::size_t> want(perm.begin() + 100, perm.begin() + 150);
  EXPECT_EQ(got, want);
  const auto whole = s.peek(1, 4, 16);
  EXPECT_EQ(s.peek_range(1, 4, 0, 64).indices, whole.indices);
  EXPECT_THROW((void)s.peek_range(0, 2, 850, 51), InvalidArgument);
  EXPECT_THROW((void)s.peek_range(2, 2, 0, 10), InvalidArgument);
}
}  // namespace sinew::data
