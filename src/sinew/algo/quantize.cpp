#include "sinew/algo/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "sinew/core/error.hpp"

namespace sinew::algo {
namespace {

struct Header {
  float min;
  float scale;
};
static_assert(sizeof(Header) == kChunkHeaderBytes);

std::size_t num_chunks(std::size_t n, std::size_t chunk) { return (n + chunk - 1) / chunk; }

/// `s` (>= 0, finite) rounded up to 16 significant bits: then code * s is exact for every 8-bit code.
float step_of(float s) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &s, sizeof bits);
  bits = (bits + 0xFFu) & ~0xFFu;
  std::memcpy(&s, &bits, sizeof s);
  return s;
}

struct MinMax {
  float lo;
  float hi;
  bool finite;  ///< no NaN and no infinity in the chunk
};

/// Minimum, maximum and finiteness in one pass. Kept in kLanes independent accumulators because the
/// compiler may not reorder a single float min/max/sum reduction (NaN and signed-zero semantics); per-lane
/// accumulators are an explicit reordering, which it turns into vector instructions.
MinMax min_max(const float* x, std::size_t n) {
  constexpr std::size_t kLanes = 16;
  float lo[kLanes];
  float hi[kLanes];
  float nonfinite[kLanes];  // sums x * 0: stays 0 unless some x is NaN or infinite (then NaN)
  for (std::size_t l = 0; l < kLanes; ++l) {
    lo[l] = std::numeric_limits<float>::infinity();
    hi[l] = -std::numeric_limits<float>::infinity();
    nonfinite[l] = 0;
  }
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) {
      const float v = x[i + l];
      lo[l] = std::min(lo[l], v);
      hi[l] = std::max(hi[l], v);
      nonfinite[l] += v * 0.f;
    }
  }
  for (std::size_t l = 0; i < n; ++i, ++l) {
    lo[l] = std::min(lo[l], x[i]);
    hi[l] = std::max(hi[l], x[i]);
    nonfinite[l] += x[i] * 0.f;
  }
  MinMax m{lo[0], hi[0], true};
  float bad = nonfinite[0];
  for (std::size_t l = 1; l < kLanes; ++l) {
    m.lo = std::min(m.lo, lo[l]);
    m.hi = std::max(m.hi, hi[l]);
    bad += nonfinite[l];
  }
  m.finite = bad == 0;
  return m;
}

template <bool kAdd>
void decode_impl(std::span<const std::byte> in, std::size_t chunk, std::span<float> out) {
  const std::size_t n = out.size();
  if (in.size() != encoded_bytes(n, chunk)) {
    SINEW_THROW(InvalidArgument,
                "quantize: {} bytes are not the encoding of {} floats in chunks of {} ({} bytes)", in.size(),
                n, chunk, encoded_bytes(n, chunk));
  }
  const std::size_t chunks = num_chunks(n, chunk);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(in.data() + chunks * kChunkHeaderBytes);
  for (std::size_t c = 0; c < chunks; ++c) {
    Header h{};
    std::memcpy(&h, in.data() + c * kChunkHeaderBytes, sizeof h);
    const std::size_t begin = c * chunk, len = std::min(chunk, n - begin);
    float* y = out.data() + begin;
    const std::uint8_t* q = codes + begin;
    for (std::size_t i = 0; i < len; ++i) {
      const float v = h.min + static_cast<float>(q[i]) * h.scale;
      if constexpr (kAdd) {
        y[i] += v;
      } else {
        y[i] = v;
      }
    }
  }
}

}  // namespace

std::size_t encoded_bytes(std::size_t n, std::size_t chunk) {
  if (chunk == 0) SINEW_THROW(InvalidArgument, "quantize: the chunk size must be at least 1 element");
  return num_chunks(n, chunk) * kChunkHeaderBytes + n;
}

void encode(std::span<const float> x, std::size_t chunk, std::span<std::byte> out) {
  const std::size_t n = x.size();
  if (out.size() != encoded_bytes(n, chunk)) {
    SINEW_THROW(InvalidArgument, "quantize: output of {} bytes for {} floats in chunks of {}; need {}",
                out.size(), n, chunk, encoded_bytes(n, chunk));
  }
  const std::size_t chunks = num_chunks(n, chunk);
  auto* codes = reinterpret_cast<std::uint8_t*>(out.data() + chunks * kChunkHeaderBytes);
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::size_t begin = c * chunk, len = std::min(chunk, n - begin);
    const float* v = x.data() + begin;
    const MinMax m = min_max(v, len);
    if (!m.finite) {
      const auto bad = static_cast<std::size_t>(
          std::find_if(v, v + len, [](float f) { return !std::isfinite(f); }) - x.data());
      SINEW_THROW(InvalidArgument,
                  "quantize: element {} of {} is {}; only finite values can be quantised (a diverging "
                  "loss? lower the learning rate)",
                  bad, n, x[bad]);
    }
    const float range = m.hi - m.lo;
    if (!std::isfinite(range)) {
      SINEW_THROW(InvalidArgument,
                  "quantize: elements {}..{} span [{}, {}], a range beyond float's; cannot quantise them",
                  begin, begin + len - 1, m.lo, m.hi);
    }
    // A chunk whose range holds zero gets a grid with zero on it (254 steps, the minimum moved by at most
    // half a step), so exact zeros decode to exact zeros: parameters that never receive a gradient (a
    // dead input pixel) must not drift by quantisation noise, which QAdam's frozen variance of 0 would
    // blow up. The step keeps 16 significant bits, so code * step is exact in float and min + zero's
    // code * step is 0 however the compiler contracts it.
    float scale = step_of(range / 255.f), lo = m.lo;
    if (m.lo <= 0.f && m.hi >= 0.f && range > 0.f) {
      scale = step_of(range / 254.f);
      lo = -std::nearbyint(-m.lo / scale) * scale;
    }
    // 1 / scale is infinite for a constant chunk (and for a range below ~1e-36): all codes are then 0
    // and decode to the minimum.
    float inv = 1.f / scale;
    if (!std::isfinite(inv)) inv = 0;
    const Header h{lo, scale};
    std::memcpy(out.data() + c * kChunkHeaderBytes, &h, sizeof h);
    std::uint8_t* q = codes + begin;
    for (std::size_t i = 0; i < len; ++i) {
      // (v - lo) * inv is in [-0.5, 254.5] (or [0, 255]) up to rounding; +0.5 and truncation round to
      // nearest, and the clamps keep rounding overshoots from wrapping around.
      q[i] = static_cast<std::uint8_t>(std::clamp((v[i] - lo) * inv + 0.5f, 0.f, 255.f));
    }
  }
}

std::vector<std::byte> encode(std::span<const float> x, std::size_t chunk) {
  std::vector<std::byte> out(encoded_bytes(x.size(), chunk));
  encode(x, chunk, out);
  return out;
}

void decode(std::span<const std::byte> in, std::size_t chunk, std::span<float> out) {
  decode_impl<false>(in, chunk, out);
}

void decode_add(std::span<const std::byte> in, std::size_t chunk, std::span<float> out) {
  decode_impl<true>(in, chunk, out);
}

}  // namespace sinew::algo
