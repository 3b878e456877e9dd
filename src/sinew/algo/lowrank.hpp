// The linear algebra of PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
// Compression for Distributed Optimization", NeurIPS 2019), apart from any communication, so that it can
// be tested on its own (docs/algorithms.md).
//
// One power-iteration step per training step approximates a gradient matrix M (rows x cols) by P Q^T of
// rank r: P = M Q, orthonormalise P's columns, Q = M^T P. Summed over ranks (P and Q are linear in M), the
// product is a rank-r approximation of the summed gradient. With a warm start (Q kept from the previous
// step) the iteration refines the subspace across steps, as the paper does.
//
// Matrices are row major: element (i, j) of a rows x cols matrix at i * cols + j.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sinew/algo/algorithm.hpp"

#include "sinew/core/flat.hpp"

namespace sinew::algo {

/// The rank PowerSGD uses for a rows x cols matrix at a requested rank `rank`: min(rank, rows, cols), or
/// 0 when the matrix is not worth compressing (a vector, or low-rank factors that would not be at least
/// half the size of the matrix: (rows + cols) * r * 2 > rows * cols, PyTorch's min_compression_rate 2).
[[nodiscard]] std::size_t powersgd_rank_of(std::size_t rows, std::size_t cols, int rank);

/// Orthonormalises the columns of the row-major rows x cols matrix `m` in place (modified Gram-Schmidt,
/// twice, in column order). A column whose remainder after removing the earlier columns is below 1e-5 of
/// its norm, or below 1e-30 (a zero gradient, or a column that depends on the earlier ones), becomes zero
/// rather than an arbitrary direction or NaN: it then adds nothing to the approximation. Deterministic:
/// the same input gives the same bytes on every rank.
void orthonormalize_columns(std::span<float> m, std::size_t rows, std::size_t cols);

/// Fills `v` with standard normal values from `seed` (splitmix64 and Box-Muller: bit for bit the same on
/// every platform), PowerSGD's initial Q.
void seeded_normal(std::span<float> v, std::uint64_t seed);

/// PowerSGD's per-matrix state and the layout of one bucket's messages.
struct LowRankFactor {
  std::size_t offset = 0;          ///< the matrix's first element in the flat buffer
  std::size_t rows = 0, cols = 0;  ///< TensorView::rows() and cols(): row major
  std::size_t rank = 0;            ///< powersgd_rank_of(rows, cols, requested)
  std::vector<float> q;            ///< cols x rank, kept from step to step (warm start)
};

/// Rank-`rank` factors of the matrices among `tensors` that are worth compressing, in buffer order, each Q
/// seeded from its index (every rank builds the same ones).
[[nodiscard]] std::vector<LowRankFactor> lowrank_factors(const std::vector<TensorView>& tensors, int rank);

/// The floats PowerSGD sends per step for gradients of `total` elements with `factors` (P and Q of each,
/// and every element outside them exactly): what a ring allreduce of that many floats costs.
[[nodiscard]] std::size_t powersgd_floats(const std::vector<LowRankFactor>& factors, std::size_t total);

}  // namespace sinew::algo
