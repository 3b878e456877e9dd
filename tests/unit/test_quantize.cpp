// The 8-bit chunked quantiser: error bound on random data, exact cases, wire size, bad inputs. Its
// throughput is measured by `sinew-bench quantize`, not here (the machines are shared).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "sinew/algo/quantize.hpp"
#include "sinew/core/error.hpp"

namespace sinew::algo {
namespace {

std::vector<float> random_floats(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

/// Checks |x - decoded| <= (max - min) / 508 per chunk, plus a few ulps of the chunk's magnitude.
void expect_within_bound(const std::vector<float>& x, const std::vector<float>& y, std::size_t chunk) {
  ASSERT_EQ(x.size(), y.size());
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const auto first = x.begin() + static_cast<std::ptrdiff_t>(begin);
    const auto last = x.begin() + static_cast<std::ptrdiff_t>(std::min(begin + chunk, x.size()));
    const auto [lo, hi] = std::minmax_element(first, last);
    const float ulps = 4 * std::numeric_limits<float>::epsilon() * std::max(std::abs(*lo), std::abs(*hi));
    const float bound = (*hi - *lo) / 508.f + ulps;
    for (auto it = first; it != last; ++it) {
      const auto i = static_cast<std::size_t>(it - x.begin());
      ASSERT_LE(std::abs(x[i] - y[i]), bound) << "element " << i << " chunk " << chunk;
    }
  }
}

TEST(Quantize, ExactZerosStayExactlyZero) {
  // Sparse data (a gradient of dead inputs, a frozen parameter) around zero, with odd ranges.
  auto x = random_floats(4096, 11, -0.37f, 1.91f);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = 0.f;
  for (const std::size_t chunk : {5, 64, 1000}) {
    std::vector<float> y(x.size());
    algo::decode(algo::encode(x, chunk), chunk, y);
    for (std::size_t i = 0; i < x.size(); i += 3)
      ASSERT_EQ(y[i], 0.f) << "element " << i << " chunk " << chunk;
    expect_within_bound(x, y, chunk);
  }
}

TEST(Quantize, RoundTripWithinBoundForSeveralChunkSizes) {
  for (const std::size_t n : {1, 15, 16, 17, 1000, 4099}) {
    for (const std::size_t chunk : {1, 7, 16, 64, 1000, 5000}) {
      const auto x = random_floats(n, static_cast<unsigned>(n * 31 + chunk), -3.f, 5.f);
      const auto bytes = encode(x, chunk);
      ASSERT_EQ(bytes.size(), encoded_bytes(n, chunk));
      std::vector<float> y(n);
      decode(bytes, chunk, y);
      expect_within_bound(x, y, chunk);
    }
  }
}

TEST(Quantize, BoundHoldsFarFromZeroAndAtExtremes) {
  // A narrow range around a large offset (x - min is computed exactly), and the chunk's min and max.
  auto x = random_floats(3000, 7, 1000.f, 1000.01f);
  x[5] = 1000.f;
  x[6] = 1000.01f;
  std::vector<float> y(x.size());
  decode(encode(x, 256), 256, y);
  expect_within_bound(x, y, 256);
  EXPECT_EQ(y[5], 1000.f);  // the minimum decodes exactly (code 0)
  // A range near float's limit still encodes.
  const std::vector<float> wide = {-1e38f, 0.f, 1e38f};
  std::vector<float> wy(3);
  decode(encode(wide, 3), 3, wy);
  expect_within_bound(wide, wy, 3);
}

TEST(Quantize, ConstantChunksAreExact) {
  std::vector<float> x(100, 0.3f);
  std::fill(x.begin() + 50, x.end(), -7.25f);  // two constant chunks of 50
  std::vector<float> y(x.size());
  decode(encode(x, 50), 50, y);
  EXPECT_EQ(x, y);
  const std::vector<float> zeros(33, 0.f);
  std::vector<float> z(33, 1.f);
  decode(encode(zeros, 8), 8, z);
  EXPECT_EQ(z, zeros);
}

TEST(Quantize, DecodeAddAccumulates) {
  const auto x = random_floats(500, 3, -1.f, 1.f);
  const auto bytes = encode(x, 64);
  std::vector<float> once(x.size()), twice(x.size(), 0.f);
  decode(bytes, 64, once);
  decode_add(bytes, 64, twice);
  decode_add(bytes, 64, twice);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(twice[i], 2 * once[i]) << i;
}

TEST(Quantize, EmptySpan) {
  EXPECT_EQ(encoded_bytes(0, 16), 0u);
  const auto bytes = encode(std::span<const float>(), 16);
  EXPECT_TRUE(bytes.empty());
  decode(bytes, 16, std::span<float>());
}

TEST(Quantize, EncodedSize) {
  EXPECT_EQ(encoded_bytes(1, 1), kChunkHeaderBytes + 1);
  EXPECT_EQ(encoded_bytes(1024, 256), 4 * kChunkHeaderBytes + 1024);
  EXPECT_EQ(encoded_bytes(1025, 256), 5 * kChunkHeaderBytes + 1025);
  EXPECT_EQ(encoded_bytes(10, 1000), kChunkHeaderBytes + 10);
  EXPECT_THROW((void)encoded_bytes(10, 0), InvalidArgument);
}

TEST(Quantize, NonFiniteInputsThrowNamingTheElement) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    auto x = random_floats(100, 1, -1.f, 1.f);
    x[42] = bad;
    try {
      (void)encode(x, 16);
      FAIL() << "no exception for " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find("element 42"), std::string::npos) << e.message();
    }
  }
  const std::vector<float> overflow = {-3e38f, 3e38f};  // max - min is not a float
  EXPECT_THROW((void)encode(overflow, 2), InvalidArgument);
}

TEST(Quantize, MismatchedSizesThrow) {
  const std::vector<float> x(10, 1.f);
  std::vector<std::byte> small(encoded_bytes(10, 4) - 1);
  EXPECT_THROW(encode(x, 4, small), InvalidArgument);
  const auto bytes = encode(x, 4);
  std::vector<float> y(11);
  EXPECT_THROW(decode(bytes, 4, y), InvalidArgument);
}

TEST(Quantize, SixteenMiBRoundTripWithinBound) {
  // A buffer as large as a real gradient bucket: many chunks, and a last chunk that is short. (Its
  // throughput is a benchmark: sinew-bench quantize.)
  const auto x = random_floats((std::size_t{1} << 22) + 333, 11, -1.f, 1.f);
  std::vector<std::byte> bytes(encoded_bytes(x.size(), 1024));
  EXPECT_EQ(bytes.size(), x.size() + ((x.size() + 1023) / 1024) * kChunkHeaderBytes);
  std::vector<float> y(x.size());
  encode(x, 1024, bytes);
  decode(bytes, 1024, y);
  expect_within_bound(x, y, 1024);
}

}  // namespace
}  // namespace sinew::algo
