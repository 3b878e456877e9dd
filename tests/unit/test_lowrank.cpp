// PowerSGD's linear algebra (algo/lowrank.hpp): which matrices it compresses and at what rank, the
// orthonormalisation of P, the seeded initial Q, and the floats it sends.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "sinew/algo/lowrank.hpp"
#include "sinew/core/error.hpp"

using namespace sinew;

TEST(LowRank, CompressesOnlyMatricesWhoseFactorsAreAtMostHalfTheirSize) {
  EXPECT_EQ(algo::powersgd_rank_of(784, 512, 4), 4u);
  EXPECT_EQ(algo::powersgd_rank_of(512, 10, 4), 4u);  // (512 + 10) * 4 * 2 = 4176 <= 5120
  EXPECT_EQ(algo::powersgd_rank_of(512, 10, 5), 0u);  // 5220 > 5120: sent exactly
  EXPECT_EQ(algo::powersgd_rank_of(512, 1, 4), 0u);   // a vector
  EXPECT_EQ(algo::powersgd_rank_of(1, 512, 4), 0u);
  EXPECT_EQ(algo::powersgd_rank_of(100, 100, 400), 0u);      // the rank is capped at 100: no saving
  EXPECT_EQ(algo::powersgd_rank_of(1000, 1000, 250), 250u);  // 2000 * 250 * 2 == 10^6: just worth it
  EXPECT_EQ(algo::powersgd_rank_of(1000, 1000, 251), 0u);
  EXPECT_THROW((void)algo::powersgd_rank_of(10, 10, 0), InvalidArgument);
}

TEST(LowRank, OrthonormalisesColumnsAndZeroesDependentOnes) {
  const std::size_t rows = 50, cols = 4;
  std::vector<float> m(rows * cols);
  algo::seeded_normal(m, 7);
  for (std::size_t i = 0; i < rows; ++i) m[i * cols + 2] = 3.f * m[i * cols + 0];  // column 2 depends on 0
  for (std::size_t i = 0; i < rows; ++i) m[i * cols + 3] = 0.f;                    // column 3 is zero
  algo::orthonormalize_columns(m, rows, cols);
  auto dot = [&](std::size_t a, std::size_t b) {
    double d = 0;
    for (std::size_t i = 0; i < rows; ++i) d += static_cast<double>(m[i * cols + a]) * m[i * cols + b];
    return d;
  };
  EXPECT_NEAR(dot(0, 0), 1.0, 1e-5);
  EXPECT_NEAR(dot(1, 1), 1.0, 1e-5);
  EXPECT_NEAR(dot(0, 1), 0.0, 1e-5);
  // A dependent column leaves only rounding noise, and a zero column nothing: both become zero, never an
  // arbitrary direction or NaN.
  for (float x : m) EXPECT_TRUE(std::isfinite(x));
  EXPECT_EQ(dot(2, 2), 0.0);
  EXPECT_EQ(dot(3, 3), 0.0);
  EXPECT_THROW(algo::orthonormalize_columns(m, rows, cols + 1), InternalError);
}

TEST(LowRank, SeededNormalIsDeterministicAndStandard) {
  std::vector<float> a(100001), b(100001);
  algo::seeded_normal(a, 42);
  algo::seeded_normal(b, 42);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  double mean = 0, var = 0;
  for (float x : a) mean += x;
  mean /= static_cast<double>(a.size());
  for (float x : a) var += (x - mean) * (x - mean);
  var /= static_cast<double>(a.size());
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.02);
  algo::seeded_normal(b, 43);
  EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(LowRank, FactorsAndFloatsOfTheFashionMnistMlp) {
  // mlp 784-512-512-10 as the trainer describes it: (in, out) weights, then the biases.
  const std::vector<TensorView> t = {
      {"fc1/weight", "params", 0, {784, 512}, ""},      {"fc1/bias", "params", 401408, {512}, ""},
      {"fc2/weight", "params", 401920, {512, 512}, ""}, {"fc2/bias", "params", 664064, {512}, ""},
      {"fc3/weight", "params", 664576, {512, 10}, ""},  {"fc3/bias", "params", 669696, {10}, ""}};
  const auto f = algo::lowrank_factors(t, 4);
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].q.size(), 512u * 4);
  EXPECT_EQ(f[2].offset, 664576u);
  EXPECT_EQ(f[2].rows, 512u);
  EXPECT_EQ(f[2].cols, 10u);
  // Q is seeded per tensor: the same on every rank, different between tensors.
  EXPECT_EQ(f[0].q, algo::lowrank_factors(t, 4)[0].q);
  EXPECT_NE(std::vector<float>(f[0].q.begin(), f[0].q.begin() + 8),
            std::vector<float>(f[1].q.begin(), f[1].q.begin() + 8));
  const std::size_t total = 669706;
  EXPECT_EQ(algo::powersgd_floats(f, total), (784 + 512 + 512 + 512 + 512 + 10) * 4 + 512 + 512 + 10);
}
