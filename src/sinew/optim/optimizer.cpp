#include "sinew/optim/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "sinew/core/error.hpp"

namespace sinew::optim {

namespace {

/// NaN-rejecting range check: !(lo <= v) is true for NaN.
void check_range(const char* opt, const char* what, float v, float lo, float hi, bool hi_open) {
  if (!(lo <= v) || (hi_open ? !(v < hi) : !(v <= hi))) {
    SINEW_THROW(InvalidArgument, "optimizer '{}': {} = {} is outside [{}, {}{}", opt, what, v, lo, hi,
                hi_open ? ")" : "]");
  }
}

constexpr float kInf = HUGE_VALF;

/// State buffer `k` of `n` zeros, where `place` puts it. Its pages are taken now (zeros written), except for
/// a reshard's (`overwritten`): the first step writes them anyway, and a rank whose state does not fit its
/// memory should fail at start, where the memory check (python/sinew/memory.py) counts what is resident.
PlacedFloats state_buffer(std::size_t n, const StatePlacement& place, std::size_t k) {
  PlacedFloats b(n, k < place.page_offset.size() ? place.page_offset[k] : 0);
  if (!place.overwritten) std::fill(b.span().begin(), b.span().end(), 0.f);
  return b;
}

}  // namespace

void Optimizer::set_steps(std::int64_t steps) {
  if (steps < 0)
    SINEW_THROW(InvalidArgument, "optimizer '{}': set_steps({}) must not be negative", name(), steps);
  steps_ = steps;
}

void Optimizer::check_step(std::span<float> params, std::span<const float> grads, float lr,
                           std::size_t expected) const {
  if (params.size() != expected || grads.size() != expected) {
    SINEW_THROW(InvalidArgument, "optimizer '{}': step over {} params and {} grads, but it was made for {}",
                name(), params.size(), grads.size(), expected);
  }
  if (!(lr >= 0) || !std::isfinite(lr)) {
    SINEW_THROW(InvalidArgument, "optimizer '{}': learning rate must be finite and >= 0, got {}", name(), lr);
  }
}

// --- SGD ---------------------------------------------------------------------------------------------------

Sgd::Sgd(const OptimizerOptions& opts, std::size_t num_params, const StatePlacement& place)
    : momentum_(opts.momentum),
      weight_decay_(opts.weight_decay),
      nesterov_(opts.nesterov),
      num_params_(num_params) {
  check_range("sgd", "momentum", momentum_, 0.f, kInf, true);
  check_range("sgd", "weight_decay", weight_decay_, 0.f, kInf, true);
  if (nesterov_ && momentum_ == 0.f) {
    SINEW_THROW(InvalidArgument, "optimizer 'sgd': nesterov needs momentum > 0");
  }
  if (momentum_ > 0.f) buf_ = state_buffer(num_params, place, 0);
}

void Sgd::step(std::span<float> params, std::span<const float> grads, float lr) {
  check_step(params, grads, lr, num_params_);
  float* p = params.data();
  const float* g = grads.data();
  const float m = momentum_, wd = weight_decay_;
  const std::size_t n = num_params_;
  if (m == 0.f) {
    for (std::size_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + wd * p[i]);
  } else if (nesterov_) {
    float* b = buf_.span().data();
    for (std::size_t i = 0; i < n; ++i) {
      const float d = g[i] + wd * p[i];
      b[i] = m * b[i] + d;
      p[i] -= lr * (d + m * b[i]);
    }
  } else {
    float* b = buf_.span().data();
    for (std::size_t i = 0; i < n; ++i) {
      b[i] = m * b[i] + (g[i] + wd * p[i]);
      p[i] -= lr * b[i];
    }
  }
  ++steps_;
}

std::vector<std::pair<std::string, std::span<float>>> Sgd::state() {
  if (momentum_ == 0.f) return {};
  return {{"momentum", buf_.span()}};
}

// --- Adam --------------------------------------------------------------------------------------------------

Adam::Adam(const OptimizerOptions& opts, std::size_t num_params, const StatePlacement& place)
    : beta1_(opts.beta1),
      beta2_(opts.beta2),
      eps_(opts.eps),
      weight_decay_(opts.weight_decay),
      num_params_(num_params),
      m_(state_buffer(num_params, place, 0)),
      v_(state_buffer(num_params, place, 1)) {
  check_range("adam", "beta1", beta1_, 0.f, 1.f, true);
  check_range("adam", "beta2", beta2_, 0.f, 1.f, true);
  check_range("adam", "eps", eps_, 0.f, kInf, true);
  check_range("adam", "weight_decay", weight_decay_, 0.f, kInf, true);
}

void Adam::step(std::span<float> params, std::span<const float> grads, float lr) {
  check_step(params, grads, lr, num_params_);
  const std::int64_t t = steps_ + 1;
  // Bias corrections in double, as PyTorch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1_), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2_), static_cast<double>(t));
  const auto step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  const auto bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = beta1_, b2 = beta2_, eps = eps_, wd = weight_decay_;
  const float c1 = 1.f - b1, c2 = 1.f - b2;
  float* p = params.data();
  const float* g = grads.data();
  float* m = m_.span().data();
  float* v = v_.span().data();
  const std::size_t n = num_params_;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = g[i] + wd * p[i];
    m[i] = b1 * m[i] + c1 * d;
    v[i] = b2 * v[i] + c2 * d * d;
    p[i] -= step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps));  // PyTorch's order of operations
  }
  steps_ = t;
}

std::vector<std::pair<std::string, std::span<float>>> Adam::state() {
  return {{"adam_m", m_.span()}, {"adam_v", v_.span()}};
}

// --- factory -----------------------------------------------------------------------------------------------

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& opts, std::size_t num_params,
                                          const StatePlacement& place) {
  if (opts.name == "sgd") return std::make_unique<Sgd>(opts, num_params, place);
  if (opts.name == "adam") return std::make_unique<Adam>(opts, num_params, place);
  SINEW_THROW(InvalidArgument, "unknown optimizer '{}'; valid optimizers: sgd, adam", opts.name);
}

}  // namespace sinew::optim
