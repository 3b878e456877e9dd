// The chunked quantiser at 8, 4 and 2 bits: error bound on random data, exact cases, packing and wire
// size, bad inputs. Its throughput is measured by `sinew-bench quantize`, not here (the machines are shared).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
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

/// Codes per byte at `bits` bits: a chunk must be a multiple of it.
std::size_t per_byte(int bits) { return static_cast<std::size_t>(8 / bits); }

/// `chunk` rounded up to a chunk size that `bits` accepts.
std::size_t aligned(std::size_t chunk, int bits) {
  const std::size_t p = per_byte(bits);
  return (chunk + p - 1) / p * p;
}

/// Checks the header's bound, |x - decoded| <= (max - min) / (2 * (2^bits - 2)) * (1 + 2^-15) per chunk
/// (/ 508, / 28, / 4), plus a few ulps of the chunk's magnitude.
void expect_within_bound(const std::vector<float>& x, const std::vector<float>& y, std::size_t chunk,
                         int bits) {
  ASSERT_EQ(x.size(), y.size());
  const float steps = static_cast<float>((1 << bits) - 2);
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const auto first = x.begin() + static_cast<std::ptrdiff_t>(begin);
    const auto last = x.begin() + static_cast<std::ptrdiff_t>(std::min(begin + chunk, x.size()));
    const auto [lo, hi] = std::minmax_element(first, last);
    const float ulps = 4 * std::numeric_limits<float>::epsilon() * std::max(std::abs(*lo), std::abs(*hi));
    const float bound = (*hi - *lo) / (2 * steps) * (1 + 0x1p-15f) + ulps;
    for (auto it = first; it != last; ++it) {
      const auto i = static_cast<std::size_t>(it - x.begin());
      ASSERT_LE(std::abs(x[i] - y[i]), bound) << "element " << i << " chunk " << chunk << " bits " << bits;
    }
  }
}

/// The tests that hold at every width, run at 8, 4 and 2 bits.
class QuantizeBits : public testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Widths, QuantizeBits, testing::Values(8, 4, 2),
                         [](const testing::TestParamInfo<int>& p) {
                           return "Bits" + std::to_string(p.param);
                         });

TEST_P(QuantizeBits, ExactZerosStayExactlyZero) {
  // Sparse data (a gradient of dead inputs, a frozen parameter) around zero, with odd ranges.
  const int bits = GetParam();
  auto x = random_floats(4096, 11, -0.37f, 1.91f);
  for (std::size_t i = 0; i < x.size(); i += 3) x[i] = 0.f;
  for (const std::size_t c : {5, 64, 1000}) {
    const std::size_t chunk = aligned(c, bits);
    std::vector<float> y(x.size());
    algo::decode(algo::encode(x, chunk, bits), chunk, y, bits);
    for (std::size_t i = 0; i < x.size(); i += 3)
      ASSERT_EQ(y[i], 0.f) << "element " << i << " chunk " << chunk << " bits " << bits;
    expect_within_bound(x, y, chunk, bits);
  }
}

TEST_P(QuantizeBits, RoundTripWithinBoundForSeveralChunkSizes) {
  // Sizes that are not a multiple of the chunk, or of the codes per byte (a last byte partly used); chunks
  // of an odd number of bytes (7 * codes per byte) and larger than the span.
  const int bits = GetParam();
  for (const std::size_t n : {1, 2, 3, 15, 16, 17, 1000, 4099}) {
    for (const std::size_t c : {1, 7, 16, 64, 1000, 5000}) {
      const std::size_t chunk = c * per_byte(bits);
      const auto x = random_floats(n, static_cast<unsigned>(n * 31 + chunk), -3.f, 5.f);
      const auto bytes = encode(x, chunk, bits);
      ASSERT_EQ(bytes.size(), encoded_bytes(n, chunk, bits));
      std::vector<float> y(n);
      decode(bytes, chunk, y, bits);
      expect_within_bound(x, y, chunk, bits);
    }
  }
}

TEST_P(QuantizeBits, BoundHoldsFarFromZeroAndAtExtremes) {
  // A narrow range around a large offset (x - min is computed exactly), and the chunk's min and max.
  const int bits = GetParam();
  auto x = random_floats(3000, 7, 1000.f, 1000.01f);
  x[5] = 1000.f;
  x[6] = 1000.01f;
  std::vector<float> y(x.size());
  decode(encode(x, 256, bits), 256, y, bits);
  expect_within_bound(x, y, 256, bits);
  EXPECT_EQ(y[5], 1000.f);  // the minimum decodes exactly (code 0)
  // A range near float's limit still encodes.
  const std::vector<float> wide = {-1e38f, 0.f, 1e38f};
  const std::size_t chunk = aligned(3, bits);
  std::vector<float> wy(3);
  decode(encode(wide, chunk, bits), chunk, wy, bits);
  expect_within_bound(wide, wy, chunk, bits);
  EXPECT_EQ(wy[1], 0.f);
}

TEST_P(QuantizeBits, ConstantChunksAreExact) {
  const int bits = GetParam();
  const std::size_t chunk = aligned(50, bits);
  std::vector<float> x(2 * chunk, 0.3f);
  std::fill(x.begin() + static_cast<std::ptrdiff_t>(chunk), x.end(), -7.25f);  // two constant chunks
  std::vector<float> y(x.size());
  decode(encode(x, chunk, bits), chunk, y, bits);
  EXPECT_EQ(x, y);
  const std::vector<float> zeros(33, 0.f);
  std::vector<float> z(33, 1.f);
  decode(encode(zeros, 8, bits), 8, z, bits);
  EXPECT_EQ(z, zeros);
}

TEST_P(QuantizeBits, DecodeAddAccumulates) {
  const int bits = GetParam();
  const auto x = random_floats(501, 3, -1.f, 1.f);  // odd: the last byte is partly used below 8 bits
  const auto bytes = encode(x, 64, bits);
  std::vector<float> once(x.size()), twice(x.size(), 0.f);
  decode(bytes, 64, once, bits);
  decode_add(bytes, 64, twice, bits);
  decode_add(bytes, 64, twice, bits);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(twice[i], 2 * once[i]) << i;
}

TEST_P(QuantizeBits, EmptySpan) {
  const int bits = GetParam();
  EXPECT_EQ(encoded_bytes(0, 16, bits), 0u);
  const auto bytes = encode(std::span<const float>(), 16, bits);
  EXPECT_TRUE(bytes.empty());
  decode(bytes, 16, std::span<float>(), bits);
}

TEST_P(QuantizeBits, NonFiniteInputsThrowNamingTheElement) {
  const int bits = GetParam();
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    auto x = random_floats(100, 1, -1.f, 1.f);
    x[42] = bad;
    try {
      (void)encode(x, 16, bits);
      FAIL() << "no exception for " << bad;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(e.message().find("element 42"), std::string::npos) << e.message();
    }
  }
  const std::vector<float> overflow = {-3e38f, 3e38f};  // max - min is not a float
  EXPECT_THROW((void)encode(overflow, aligned(2, bits), bits), InvalidArgument);
}

TEST_P(QuantizeBits, MismatchedSizesThrow) {
  const int bits = GetParam();
  const std::vector<float> x(10, 1.f);
  std::vector<std::byte> small(encoded_bytes(10, 4, bits) - 1);
  EXPECT_THROW(encode(x, 4, small, bits), InvalidArgument);
  const auto bytes = encode(x, 4, bits);
  // 14 floats take more bytes than 10 at every width (11 or 12 would not at 2 bits: 3 code bytes too).
  std::vector<float> y(14);
  EXPECT_THROW(decode(bytes, 4, y, bits), InvalidArgument);
  EXPECT_THROW(decode_add(bytes, 4, y, bits), InvalidArgument);
  // Bytes of another width.
  std::vector<float> z(10);
  const int other = bits == 8 ? 4 : 8;
  EXPECT_THROW(decode(bytes, 4, z, other), InvalidArgument);
}

TEST_P(QuantizeBits, SixteenMiBRoundTripWithinBound) {
  // A buffer as large as a real gradient bucket: many chunks, and a last chunk that is short and odd. (Its
  // throughput is a benchmark: sinew-bench quantize.)
  const int bits = GetParam();
  const auto x = random_floats((std::size_t{1} << 22) + 333, 11, -1.f, 1.f);
  std::vector<std::byte> bytes(encoded_bytes(x.size(), 1024, bits));
  EXPECT_EQ(bytes.size(), (x.size() * static_cast<std::size_t>(bits) + 7) / 8 +
                              ((x.size() + 1023) / 1024) * kChunkHeaderBytes);
  std::vector<float> y(x.size());
  encode(x, 1024, bytes, bits);
  decode(bytes, 1024, y, bits);
  expect_within_bound(x, y, 1024, bits);
}

TEST(Quantize, EncodedSize) {
  constexpr std::size_t kH = kChunkHeaderBytes;
  // 8 bits: one byte per element.
  EXPECT_EQ(encoded_bytes(1, 1), kH + 1);
  EXPECT_EQ(encoded_bytes(1024, 256), 4 * kH + 1024);
  EXPECT_EQ(encoded_bytes(1025, 256), 5 * kH + 1025);
  EXPECT_EQ(encoded_bytes(10, 1000), kH + 10);
  EXPECT_EQ(encoded_bytes(1025, 256, 8), encoded_bytes(1025, 256));  // 8 is the default
  // 4 bits: ceil(n / 2) code bytes.
  EXPECT_EQ(encoded_bytes(1, 2, 4), kH + 1);
  EXPECT_EQ(encoded_bytes(1024, 256, 4), 4 * kH + 512);
  EXPECT_EQ(encoded_bytes(1025, 256, 4), 5 * kH + 513);
  EXPECT_EQ(encoded_bytes(7, 2, 4), 4 * kH + 4);
  EXPECT_EQ(encoded_bytes(10, 1000, 4), kH + 5);
  // 2 bits: ceil(n / 4) code bytes.
  EXPECT_EQ(encoded_bytes(1, 4, 2), kH + 1);
  EXPECT_EQ(encoded_bytes(1024, 256, 2), 4 * kH + 256);
  EXPECT_EQ(encoded_bytes(1025, 256, 2), 5 * kH + 257);
  EXPECT_EQ(encoded_bytes(7, 4, 2), 2 * kH + 2);
  EXPECT_EQ(encoded_bytes(10, 1000, 2), kH + 3);
}

/// The exception's message, or "" if `f` does not throw InvalidArgument.
template <typename F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  return "";
}

TEST(Quantize, BadChunkOrBitsThrow) {
  const std::vector<float> x(16, 1.f);
  std::vector<float> y(16);
  for (const int bits : {8, 4, 2}) EXPECT_THROW((void)encoded_bytes(10, 0, bits), InvalidArgument) << bits;
  // Only 8, 4 and 2 bits, named by the option that sets them.
  for (const int bits : {-4, 0, 1, 3, 5, 7, 16, 32}) {
    SCOPED_TRACE(bits);
    EXPECT_NE(invalid_argument_message([&] { (void)encoded_bytes(16, 16, bits); }).find("--bytegrad-bits"),
              std::string::npos);
    EXPECT_THROW((void)encode(x, 16, bits), InvalidArgument);
    std::vector<std::byte> bytes(encoded_bytes(16, 16));
    EXPECT_THROW(encode(x, 16, bytes, bits), InvalidArgument);
    EXPECT_THROW(decode(bytes, 16, y, bits), InvalidArgument);
    EXPECT_THROW(decode_add(bytes, 16, y, bits), InvalidArgument);
  }
  // Below 8 bits every chunk starts on a byte: the chunk is a multiple of 8 / bits.
  struct Format {
    int bits;
    std::size_t chunk;
  };
  for (const Format f : {Format{4, 1}, Format{4, 3}, Format{4, 1001}, Format{2, 1}, Format{2, 2},
                         Format{2, 6}, Format{2, 1022}}) {
    SCOPED_TRACE(testing::Message() << f.bits << " bits, chunk " << f.chunk);
    const std::string m = invalid_argument_message([&] { (void)encoded_bytes(16, f.chunk, f.bits); });
    EXPECT_NE(m.find("--compress-chunk"), std::string::npos) << m;
    EXPECT_THROW((void)encode(x, f.chunk, f.bits), InvalidArgument);
  }
  for (const Format f :
       {Format{8, 1}, Format{8, 3}, Format{4, 2}, Format{4, 6}, Format{2, 4}, Format{2, 12}}) {
    EXPECT_NO_THROW((void)encoded_bytes(16, f.chunk, f.bits)) << f.bits << " bits, chunk " << f.chunk;
  }
}

TEST(Quantize, CodesArePackedLowBitsFirst) {
  // Grids with a step of exactly 1 (no zero in the range): the codes are x - min. Element i is at bit
  // i * bits of the code bytes, low bits first; the last byte's unused bits are 0; each chunk starts on a
  // byte.
  constexpr std::size_t kH = kChunkHeaderBytes;
  const auto codes = [](const std::vector<std::byte>& bytes, std::size_t chunks) {
    std::vector<unsigned> c;
    for (std::size_t i = chunks * kH; i < bytes.size(); ++i) c.push_back(std::to_integer<unsigned>(bytes[i]));
    return c;
  };
  // 4 bits, one chunk, 5 codes {0, 15, 1, 14, 2}.
  const std::vector<float> x4 = {1, 16, 2, 15, 3};
  const auto b4 = encode(x4, 6, 4);
  EXPECT_EQ(codes(b4, 1), (std::vector<unsigned>{0xF0, 0xE1, 0x02}));
  // 2 bits, chunks of 4: {1, 2, 3, 4} -> codes {0, 1, 2, 3}; {4, 3, 2, 1} -> {3, 2, 1, 0}; {10, 13} -> {0,
  // 3}.
  const std::vector<float> x2 = {1, 2, 3, 4, 4, 3, 2, 1, 10, 13};
  const auto b2 = encode(x2, 4, 2);
  EXPECT_EQ(codes(b2, 3), (std::vector<unsigned>{0xE4, 0x1B, 0x0C}));
  // 2 bits, one chunk of 8 holding 7 codes {0, 1, 2, 3, 3, 2, 1}: the chunk's second byte is its last.
  const std::vector<float> x7 = {1, 2, 3, 4, 4, 3, 2};
  EXPECT_EQ(codes(encode(x7, 8, 2), 1), (std::vector<unsigned>{0xE4, 0x1B}));
  std::vector<float> y4(x4.size()), y2(x2.size());  // a step of 1 decodes exactly
  decode(b4, 6, y4, 4);
  EXPECT_EQ(y4, x4);
  decode(b2, 4, y2, 2);
  EXPECT_EQ(y2, x2);
}

}  // namespace
}  // namespace sinew::algo
