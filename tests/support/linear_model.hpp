// A linear least-squares model whose forward and backward a test computes itself, for driving a
// train::Session from outside the built-in loop: y = w . x + b on deterministic synthetic samples (x from a
// hash of the sample's index, the target a fixed linear function of x plus a little noise). Parameters in
// one flat buffer: w (kDim), b (1) and, with `unused`, a block u (3) that takes no part in the loss (a
// parameter without a gradient, for --find-unused-parameters).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "sinew/core/flat.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::test_support {

struct LinearModel {
  static constexpr std::size_t kDim = 6;
  bool unused = false;

  [[nodiscard]] std::size_t num_params() const { return kDim + 1 + (unused ? 3 : 0); }
  /// Backward's order: the bias, then the weights; u (never reported) last.
  [[nodiscard]] std::vector<Slice> ready_order() const {
    std::vector<Slice> r = {{kDim, 1}, {0, kDim}};
    if (unused) r.push_back({kDim + 1, 3});
    return r;
  }
  [[nodiscard]] std::vector<TensorView> views() const {
    std::vector<TensorView> v = {{"linear/weight", "params", 0, {kDim}, "y = w . x + b"},
                                 {"linear/bias", "params", kDim, {1}, ""}};
    if (unused) v.push_back({"unused/u", "params", kDim + 1, {3}, "takes no part in the loss"});
    return v;
  }

  /// Feature j of sample i, in [-1, 1).
  static float feature(std::size_t i, std::size_t j) {
    std::uint64_t z = (i * kDim + j + 1) * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<float>(z >> 40) / static_cast<float>(1ULL << 23) - 1.f;
  }
  static float target(std::size_t i) {
    float t = 0.3f;
    for (std::size_t j = 0; j < kDim; ++j) t += (static_cast<float>(j) - 2.5f) * 0.4f * feature(i, j);
    return t + 0.05f * feature(i + 7919, 0);
  }

  /// Forward and backward over `indices`: adds (accumulate) or writes this rank's share of the gradient of
  /// the mean squared error over `denominator` samples into `grads`; calls ready(range) per range (bias,
  /// then weights) once final, if given. Returns this rank's share of the loss.
  double train(std::span<const float> params, std::span<float> grads, std::span<const std::size_t> indices,
               double denominator, bool accumulate, const workload::ReadyFn& ready = {}) const {
    if (!accumulate) std::fill(grads.begin(), grads.begin() + static_cast<std::ptrdiff_t>(kDim + 1), 0.f);
    double loss = 0;
    std::vector<float> gw(kDim, 0.f);
    float gb = 0;
    for (const std::size_t i : indices) {
      float y = params[kDim];
      for (std::size_t j = 0; j < kDim; ++j) y += params[j] * feature(i, j);
      const float err = y - target(i);
      loss += 0.5 * static_cast<double>(err) * err / denominator;
      const auto e = static_cast<float>(err / denominator);
      gb += e;
      for (std::size_t j = 0; j < kDim; ++j) gw[j] += e * feature(i, j);
    }
    grads[kDim] += gb;
    if (ready) ready({kDim, 1});
    for (std::size_t j = 0; j < kDim; ++j) grads[j] += gw[j];
    if (ready) ready({0, kDim});
    return loss;
  }

  /// {sum of squared errors / 2, samples within 0.1 of their target} over `indices`.
  workload::EvalSums evaluate(std::span<const float> params, std::span<const std::size_t> indices) const {
    workload::EvalSums s;
    for (const std::size_t i : indices) {
      float y = params[kDim];
      for (std::size_t j = 0; j < kDim; ++j) y += params[j] * feature(i, j);
      const float err = y - target(i);
      s.loss += 0.5 * static_cast<double>(err) * err;
      if (std::fabs(err) < 0.1f) ++s.correct;
    }
    return s;
  }
};

}  // namespace sinew::test_support
