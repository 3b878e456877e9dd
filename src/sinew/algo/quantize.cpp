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

/// `s` (>= 0, finite) rounded up to 16 significant bits: then code * s is exact for every code (8 bits at
/// most).
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

/// Checks the codec's parameters; returns the codes per byte (1, 2 or 4).
std::size_t check_format(std::size_t chunk, int bits) {
  if (bits != 8 && bits != 4 && bits != 2) {
    SINEW_THROW(InvalidArgument,
                "quantize: {} bits per element is not supported; --bytegrad-bits must be 8, 4 or 2", bits);
  }
  if (chunk == 0) SINEW_THROW(InvalidArgument, "quantize: the chunk size must be at least 1 element");
  const auto per_byte = static_cast<std::size_t>(8 / bits);
  if (chunk % per_byte != 0) {
    SINEW_THROW(
        InvalidArgument,
        "quantize: {}-bit codes are packed {} to a byte and every chunk starts on a byte, so the chunk "
        "size must be a multiple of {}; --compress-chunk is {}",
        bits, per_byte, per_byte, chunk);
  }
  return per_byte;
}

/// Bytes of the codes of n elements, `per_byte` to a byte.
std::size_t code_bytes(std::size_t n, std::size_t per_byte) {
  return n / per_byte + (n % per_byte != 0 ? 1 : 0);
}

/// The `kBits`-bit codes of the `len` floats at v on the grid {lo, 1 / scale = inv}, packed into q.
template <int kBits>
void encode_codes(const float* v, std::size_t len, float lo, float inv, std::uint8_t* q) {
  if constexpr (kBits == 8) {
    for (std::size_t i = 0; i < len; ++i) {
      // (v - lo) * inv is in [-0.5, 254.5] (or [0, 255]) up to rounding; +0.5 and truncation round to
      // nearest, and the clamps keep rounding overshoots from wrapping around.
      q[i] = static_cast<std::uint8_t>(std::clamp((v[i] - lo) * inv + 0.5f, 0.f, 255.f));
    }
  } else {
    // As at 8 bits, one output byte (8 / kBits elements) per iteration: the compiler vectorises it with
    // interleaved loads. The codes go through int32 (a vector conversion on every x86-64 level).
    constexpr std::size_t kPer = 8 / kBits;
    constexpr auto kTop = static_cast<float>((1 << kBits) - 1);
    const auto code = [lo, inv, kTop](float x) {
      return static_cast<std::uint32_t>(
          static_cast<std::int32_t>(std::clamp((x - lo) * inv + 0.5f, 0.f, kTop)));
    };
    const std::size_t full = len / kPer;
    for (std::size_t j = 0; j < full; ++j) {
      std::uint32_t b = 0;
      for (std::size_t k = 0; k < kPer; ++k) b |= code(v[j * kPer + k]) << (k * kBits);
      q[j] = static_cast<std::uint8_t>(b);
    }
    if (const std::size_t rest = len % kPer; rest > 0) {  // the span's last byte: the high bits stay 0
      std::uint32_t b = 0;
      for (std::size_t k = 0; k < rest; ++k) b |= code(v[full * kPer + k]) << (k * kBits);
      q[full] = static_cast<std::uint8_t>(b);
    }
  }
}

/// y = (or += with kAdd) lo + code * scale for the `len` `kBits`-bit codes packed at q.
template <int kBits, bool kAdd>
void decode_codes(const std::uint8_t* q, std::size_t len, float lo, float scale, float* y) {
  const auto put = [](float& out, float v) {
    if constexpr (kAdd) {
      out += v;
    } else {
      out = v;
    }
  };
  if constexpr (kBits == 8) {
    for (std::size_t i = 0; i < len; ++i) put(y[i], lo + static_cast<float>(q[i]) * scale);
  } else {
    constexpr std::size_t kPer = 8 / kBits;
    constexpr std::uint32_t kMask = (1u << kBits) - 1;
    const std::size_t full = len / kPer;
    for (std::size_t j = 0; j < full; ++j) {  // one input byte per iteration
      const std::uint32_t b = q[j];
      for (std::size_t k = 0; k < kPer; ++k) {
        put(y[j * kPer + k],
            lo + static_cast<float>(static_cast<std::int32_t>((b >> (k * kBits)) & kMask)) * scale);
      }
    }
    const std::uint32_t b = full * kPer < len ? q[full] : 0;
    for (std::size_t k = 0; full * kPer + k < len; ++k) {
      put(y[full * kPer + k],
          lo + static_cast<float>(static_cast<std::int32_t>((b >> (k * kBits)) & kMask)) * scale);
    }
  }
}

template <int kBits>
void encode_impl(std::span<const float> x, std::size_t chunk, std::span<std::byte> out) {
  constexpr std::size_t kPer = 8 / kBits;
  constexpr float kSteps = static_cast<float>((1 << kBits) - 1);  // 255, 15, 3
  const std::size_t n = x.size();
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
    // A chunk whose range holds zero gets a grid with zero on it (one step fewer, the minimum moved by at
    // most half a step), so exact zeros decode to exact zeros: parameters that never receive a gradient (a
    // dead input pixel) must not drift by quantisation noise, which QAdam's frozen variance of 0 would
    // blow up. The step keeps 16 significant bits, so code * step is exact in float and min + zero's
    // code * step is 0 however the compiler contracts it.
    float scale = step_of(range / kSteps), lo = m.lo;
    if (m.lo <= 0.f && m.hi >= 0.f && range > 0.f) {
      scale = step_of(range / (kSteps - 1.f));
      lo = -std::nearbyint(-m.lo / scale) * scale;
    }
    // 1 / scale is infinite for a constant chunk (and for a range below ~1e-36): all codes are then 0
    // and decode to the minimum.
    float inv = 1.f / scale;
    if (!std::isfinite(inv)) inv = 0;
    const Header h{lo, scale};
    std::memcpy(out.data() + c * kChunkHeaderBytes, &h, sizeof h);
    encode_codes<kBits>(v, len, lo, inv, codes + begin / kPer);  // begin is a multiple of kPer
  }
}

template <int kBits, bool kAdd>
void decode_impl(std::span<const std::byte> in, std::size_t chunk, std::span<float> out) {
  constexpr std::size_t kPer = 8 / kBits;
  const std::size_t n = out.size();
  const std::size_t chunks = num_chunks(n, chunk);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(in.data() + chunks * kChunkHeaderBytes);
  for (std::size_t c = 0; c < chunks; ++c) {
    Header h{};
    std::memcpy(&h, in.data() + c * kChunkHeaderBytes, sizeof h);
    const std::size_t begin = c * chunk, len = std::min(chunk, n - begin);
    decode_codes<kBits, kAdd>(codes + begin / kPer, len, h.min, h.scale, out.data() + begin);
  }
}

template <bool kAdd>
void decode_any(std::span<const std::byte> in, std::size_t chunk, std::span<float> out, int bits) {
  const std::size_t n = out.size();
  if (in.size() != encoded_bytes(n, chunk, bits)) {
    SINEW_THROW(InvalidArgument,
                "quantize: {} bytes are not the {}-bit encoding of {} floats in chunks of {} ({} bytes)",
                in.size(), bits, n, chunk, encoded_bytes(n, chunk, bits));
  }
  switch (bits) {
    case 8:
      decode_impl<8, kAdd>(in, chunk, out);
      break;
    case 4:
      decode_impl<4, kAdd>(in, chunk, out);
      break;
    default:  // 2: encoded_bytes accepted nothing else
      decode_impl<2, kAdd>(in, chunk, out);
      break;
  }
}

}  // namespace

std::size_t encoded_bytes(std::size_t n, std::size_t chunk, int bits) {
  const std::size_t per_byte = check_format(chunk, bits);
  return num_chunks(n, chunk) * kChunkHeaderBytes + code_bytes(n, per_byte);
}

void encode(std::span<const float> x, std::size_t chunk, std::span<std::byte> out, int bits) {
  const std::size_t n = x.size();
  if (out.size() != encoded_bytes(n, chunk, bits)) {
    SINEW_THROW(InvalidArgument,
                "quantize: output of {} bytes for {} floats in chunks of {} at {} bits; need {}", out.size(),
                n, chunk, bits, encoded_bytes(n, chunk, bits));
  }
  switch (bits) {
    case 8:
      encode_impl<8>(x, chunk, out);
      break;
    case 4:
      encode_impl<4>(x, chunk, out);
      break;
    default:  // 2: encoded_bytes accepted nothing else
      encode_impl<2>(x, chunk, out);
      break;
  }
}

std::vector<std::byte> encode(std::span<const float> x, std::size_t chunk, int bits) {
  std::vector<std::byte> out(encoded_bytes(x.size(), chunk, bits));
  encode(x, chunk, out, bits);
  return out;
}

void decode(std::span<const std::byte> in, std::size_t chunk, std::span<float> out, int bits) {
  decode_any<false>(in, chunk, out, bits);
}

void decode_add(std::span<const std::byte> in, std::size_t chunk, std::span<float> out, int bits) {
  decode_any<true>(in, chunk, out, bits);
}

}  // namespace sinew::algo
