// The GPU ByteGrad codec (comm/nccl/quantize.hpp) against the CPU codec (algo/quantize.hpp): the same sizes,
// the same bytes (headers equal as floats, codes equal; the documented exceptions are tolerated and
// counted), bit-identical decoding both ways, and the documented NaN behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu.hpp"
#include "sinew/algo/quantize.hpp"
#include "sinew/comm/nccl/quantize.hpp"
#include "sinew/core/error.hpp"
#include "sinew/cuda/buffer.hpp"
#include "sinew/cuda/stream.hpp"

namespace sinew::algo {
namespace {

using sinew::cuda::DeviceBuffer;
using sinew::cuda::Stream;
namespace gpu = sinew::comm::nccl;

/// Gradient-like data: normal values at several scales, exact zeros, a constant run.
std::vector<float> gradient_like(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const float scale = (i / 1000) % 3 == 0 ? 1e-3f : ((i / 1000) % 3 == 1 ? 1.f : 40.f);
    v[i] = i % 7 == 0 ? 0.f : normal(gen) * scale;
  }
  for (std::size_t i = n / 2; i < std::min(n, n / 2 + 300); ++i) v[i] = 0.25f;  // constant stretch
  return v;
}

/// GPU encoding of x, at byte `offset` of the device buffer (headers at odd addresses too).
std::vector<std::byte> gpu_encode(const std::vector<float>& x, std::size_t chunk, std::size_t offset,
                                  Stream& s) {
  const std::size_t bytes = gpu::encoded_bytes(x.size(), chunk);
  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<std::byte> out(bytes + offset);
  dx.upload(std::span<const float>(x), s.get());
  gpu::encode(dx.data(), x.size(), chunk, out.data() + offset, s.get());
  std::vector<std::byte> host(bytes);
  out.download(host, s.get(), offset);
  s.synchronize();
  return host;
}

/// GPU decode (or decode_add onto `base`) of an encoding, at byte `offset` of the device buffer.
std::vector<float> gpu_decode(const std::vector<std::byte>& enc, std::size_t n, std::size_t chunk,
                              std::size_t offset, const std::vector<float>* base, Stream& s) {
  DeviceBuffer<std::byte> in(enc.size() + offset);
  in.upload(std::span<const std::byte>(enc), s.get(), offset);
  DeviceBuffer<float> out(n);
  if (base != nullptr) {
    out.upload(std::span<const float>(*base), s.get());
    gpu::decode_add(in.data() + offset, n, chunk, out.data(), s.get());
  } else {
    gpu::decode(in.data() + offset, n, chunk, out.data(), s.get());
  }
  std::vector<float> host(n);
  out.download(host, s.get());
  s.synchronize();
  return host;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// No GPU needed: the GPU codec states its sizes itself (it lies below algo/), and they must be the CPU's.
TEST(CudaQuantize, EncodedSizesAreTheCpuCodecs) {
  EXPECT_EQ(gpu::kChunkHeaderBytes, kChunkHeaderBytes);
  for (const std::size_t n : {0, 1, 17, 1000, 10007}) {
    for (const std::size_t chunk : {1, 7, 64, 255, 256, 2048, 5000}) {
      EXPECT_EQ(gpu::encoded_bytes(n, chunk), encoded_bytes(n, chunk)) << "n " << n << " chunk " << chunk;
    }
  }
  EXPECT_THROW((void)gpu::encoded_bytes(4, 0), InvalidArgument);
}

TEST(CudaQuantize, EncodesTheCpuBytesAndDecodesBitForBit) {
  SINEW_REQUIRE_GPU();
  Stream s;
  for (const std::size_t n : {1, 17, 1000, 10007}) {
    for (const std::size_t chunk : {1, 7, 64, 255, 256, 2048, 5000}) {
      for (const std::size_t offset : {0, 1, 3}) {
        SCOPED_TRACE(testing::Message() << "n " << n << " chunk " << chunk << " offset " << offset);
        const auto x = gradient_like(n, static_cast<unsigned>(n * 13 + chunk));
        const auto cpu = encode(x, chunk);
        const auto gpu = gpu_encode(x, chunk, offset, s);
        ASSERT_EQ(gpu.size(), cpu.size());
        const std::size_t chunks = (n + chunk - 1) / chunk;
        for (std::size_t c = 0; c < chunks; ++c) {
          float hc[2], hg[2];
          std::memcpy(hc, cpu.data() + c * kChunkHeaderBytes, sizeof hc);
          std::memcpy(hg, gpu.data() + c * kChunkHeaderBytes, sizeof hg);
          // Equal as floats: a zero minimum may differ in sign only (documented).
          ASSERT_EQ(hg[0], hc[0]) << "chunk " << c << " min";
          ASSERT_EQ(hg[1], hc[1]) << "chunk " << c << " scale";
        }
        // Codes: identical, except (documented) a value within one rounding of a half step when the CPU
        // build does not fuse the multiply-add; that would show as a difference of 1.
        std::size_t off_by_one = 0;
        for (std::size_t i = chunks * kChunkHeaderBytes; i < cpu.size(); ++i) {
          const int d = std::abs(static_cast<int>(gpu[i]) - static_cast<int>(cpu[i]));
          ASSERT_LE(d, 1) << "code " << i - chunks * kChunkHeaderBytes;
          off_by_one += static_cast<std::size_t>(d);
        }
        EXPECT_LE(off_by_one, n / 1000) << "codes off by one";

        // Decoding the CPU's bytes on the GPU gives the CPU's floats, bit for bit; decode_add too.
        std::vector<float> want(n);
        decode(cpu, chunk, want);
        EXPECT_TRUE(same_bits(gpu_decode(cpu, n, chunk, offset, nullptr, s), want));
        std::vector<float> sum = x;
        decode_add(cpu, chunk, sum);
        EXPECT_TRUE(same_bits(gpu_decode(cpu, n, chunk, offset, &x, s), sum));
        // And the GPU's bytes decode on the CPU to the same numbers as the CPU's own.
        std::vector<float> from_gpu(n);
        decode(gpu, chunk, from_gpu);
        for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(from_gpu[i], want[i]) << "element " << i;
      }
    }
  }
}

TEST(CudaQuantize, ExactZerosAndConstantChunksStayExact) {
  SINEW_REQUIRE_GPU();
  Stream s;
  std::vector<float> x(4096, 0.f);
  for (std::size_t i = 2048; i < x.size(); ++i)
    x[i] = i % 3 == 0 ? 0.f : 0.001f * static_cast<float>(i % 97) - 0.03f;
  const std::size_t chunk = 1024;
  const auto y = gpu_decode(gpu_encode(x, chunk, 0, s), x.size(), chunk, 0, nullptr, s);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == 0.f) {
      ASSERT_EQ(y[i], 0.f) << "element " << i;
    }
  }
}

TEST(CudaQuantize, NonFiniteChunkDecodesToNan) {
  SINEW_REQUIRE_GPU();
  Stream s;
  std::vector<float> x(300, 1.5f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[250] = std::numeric_limits<float>::infinity();
  const std::size_t chunk = 100;  // chunks 0 and 2 are poisoned, chunk 1 is fine
  const auto y = gpu_decode(gpu_encode(x, chunk, 0, s), x.size(), chunk, 0, nullptr, s);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i < 100 || i >= 200) {
      ASSERT_TRUE(std::isnan(y[i])) << "element " << i;
    } else {
      ASSERT_EQ(y[i], 1.5f) << "element " << i;
    }
  }
}

TEST(CudaQuantize, RefusesChunkZeroAndIgnoresEmptyInput) {
  SINEW_REQUIRE_GPU();
  Stream s;
  DeviceBuffer<float> x(4);
  DeviceBuffer<std::byte> out(64);
  EXPECT_THROW(gpu::encode(x.data(), 4, 0, out.data(), s.get()), InvalidArgument);
  EXPECT_THROW(gpu::decode(out.data(), 4, 0, x.data(), s.get()), InvalidArgument);
  EXPECT_NO_THROW(gpu::encode(x.data(), 0, 16, out.data(), s.get()));
  EXPECT_NO_THROW(gpu::decode_add(out.data(), 0, 16, x.data(), s.get()));
  s.synchronize();
}

}  // namespace
}  // namespace sinew::algo
