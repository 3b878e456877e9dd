#include "sinew/torch/tensor_optimizer.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

namespace sinew::pytorch {

TensorOptimizer::TensorOptimizer(const optim::OptimizerOptions& options, const at::Tensor& params)
    : options_(options) {
  (void)optim::make_optimizer(options, 0);  // the same checks and messages as the host optimisers
  if (options.name == "adam") {
    state_.emplace_back("adam_m", at::zeros_like(params));
    state_.emplace_back("adam_v", at::zeros_like(params));
  } else if (options.momentum > 0) {
    state_.emplace_back("momentum", at::zeros_like(params));
  }
}

void TensorOptimizer::step(at::Tensor& params, const at::Tensor& grads, float lr) {
  at::NoGradGuard no_grad;
  const optim::OptimizerOptions& o = options_;
  // g' = g + wd * p (a new tensor only with weight decay)
  const at::Tensor g = o.weight_decay > 0 ? grads.add(params, o.weight_decay) : grads;
  ++steps_;
  if (o.name == "adam") {
    at::Tensor& m = state_[0].second;
    at::Tensor& v = state_[1].second;
    m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
    v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    const double t = static_cast<double>(steps_);
    const double c1 = 1.0 - std::pow(static_cast<double>(o.beta1), t);
    const double c2 = 1.0 - std::pow(static_cast<double>(o.beta2), t);
    // p -= lr / c1 * m / (sqrt(v) / sqrt(c2) + eps)
    const at::Tensor denom = v.sqrt().div_(std::sqrt(c2)).add_(o.eps);
    params.addcdiv_(m, denom, -static_cast<double>(lr) / c1);
    return;
  }
  if (o.momentum > 0) {
    at::Tensor& buf = state_[0].second;
    buf.mul_(o.momentum).add_(g);
    if (o.nesterov) {
      params.add_(g.add(buf, o.momentum), -static_cast<double>(lr));
    } else {
      params.add_(buf, -static_cast<double>(lr));
    }
    return;
  }
  params.add_(g, -static_cast<double>(lr));
}

}  // namespace sinew::pytorch
