#include "sinew/algo/lowrank.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "sinew/core/error.hpp"

namespace sinew::algo {

std::size_t powersgd_rank_of(std::size_t rows, std::size_t cols, int rank) {
  if (rank < 1) SINEW_THROW(InvalidArgument, "--powersgd-rank must be at least 1, got {}", rank);
  if (rows < 2 || cols < 2) return 0;
  const std::size_t r = std::min({static_cast<std::size_t>(rank), rows, cols});
  constexpr std::size_t kMinCompressionRate = 2;  // PyTorch's PowerSGDState default
  return (rows + cols) * r * kMinCompressionRate <= rows * cols ? r : 0;
}

void orthonormalize_columns(std::span<float> m, std::size_t rows, std::size_t cols) {
  SINEW_ENFORCE(m.size() == rows * cols, "orthonormalize_columns: {} elements for {} x {}", m.size(), rows,
                cols);
  // A remainder this much smaller than its column is rounding noise of a dependent column: normalising it
  // would give an arbitrary direction that is not orthogonal to the others.
  constexpr double kRelative = 1e-5, kTiny = 1e-30;
  auto norm_of = [&](std::size_t j) {
    double s = 0;
    for (std::size_t i = 0; i < rows; ++i) s += static_cast<double>(m[i * cols + j]) * m[i * cols + j];
    return std::sqrt(s);
  };
  for (std::size_t j = 0; j < cols; ++j) {
    const double before = norm_of(j);
    // Two passes of modified Gram-Schmidt ("twice is enough"): orthogonal to float precision.
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < j; ++k) {
        double dot = 0;
        for (std::size_t i = 0; i < rows; ++i) dot += static_cast<double>(m[i * cols + j]) * m[i * cols + k];
        const auto d = static_cast<float>(dot);
        for (std::size_t i = 0; i < rows; ++i) m[i * cols + j] -= d * m[i * cols + k];
      }
    }
    const double norm = norm_of(j);
    const auto inv = norm < kTiny || norm < kRelative * before ? 0.f : static_cast<float>(1.0 / norm);
    for (std::size_t i = 0; i < rows; ++i) m[i * cols + j] *= inv;
  }
}

void seeded_normal(std::span<float> v, std::uint64_t seed) {
  std::uint64_t state = seed;
  auto next = [&state] {  // splitmix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  // Uniform in (0, 1]: 53 random bits, never 0, so that the logarithm is finite.
  auto uniform = [&] { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; };
  for (std::size_t i = 0; i < v.size(); i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform())), angle = 2.0 * std::numbers::pi * uniform();
    v[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < v.size()) v[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

std::vector<LowRankFactor> lowrank_factors(const std::vector<TensorView>& tensors, int rank) {
  std::vector<LowRankFactor> out;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const TensorView& s = tensors[t];
    const std::size_t rows = s.rows(), cols = s.cols();
    const std::size_t r = powersgd_rank_of(rows, cols, rank);
    if (r == 0) continue;
    LowRankFactor f{s.offset, rows, cols, r, std::vector<float>(cols * r)};
    seeded_normal(f.q, 0x5057534744ULL + t);  // "PWSGD" + the tensor's index
    out.push_back(std::move(f));
  }
  return out;
}

std::size_t powersgd_floats(const std::vector<LowRankFactor>& factors, std::size_t total) {
  std::size_t floats = total;
  for (const auto& f : factors) floats = floats - f.rows * f.cols + (f.rows + f.cols) * f.rank;
  return floats;
}

}  // namespace sinew::algo
