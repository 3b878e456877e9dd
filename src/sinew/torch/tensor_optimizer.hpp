// Sinew's fused optimisers (optim/optimizer.hpp: SGD with momentum, Nesterov and weight decay; Adam with bias
// correction) over flat torch tensors, for a PyTorch model whose flat buffers are in device memory: the
// same formulas as optim::Sgd and optim::Adam (torch.optim's), written as torch operations so that they run
// where the tensors are, on the current stream. The state has optim's names ("momentum"; "adam_m",
// "adam_v"), so checkpoints of either are the same.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sinew/optim/optimizer.hpp"

namespace sinew::pytorch {

class TensorOptimizer {
 public:
  /// State tensors like `params` (its device, float32, zero). Throws InvalidArgument as
  /// optim::make_optimizer does for an unknown name or an option out of range.
  TensorOptimizer(const optim::OptimizerOptions& options, const at::Tensor& params);

  [[nodiscard]] const std::string& name() const noexcept { return options_.name; }
  /// One update of `params` from `grads` with learning rate `lr`; increments steps().
  void step(at::Tensor& params, const at::Tensor& grads, float lr);
  /// The state by name, each a flat tensor of the parameters' size.
  [[nodiscard]] std::vector<std::pair<std::string, at::Tensor>>& state() noexcept { return state_; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  void set_steps(std::int64_t steps) noexcept { steps_ = steps; }

 private:
  optim::OptimizerOptions options_;
  std::vector<std::pair<std::string, at::Tensor>> state_;
  std::int64_t steps_ = 0;
};

}  // namespace sinew::pytorch
