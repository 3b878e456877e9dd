// Optimizers over the flat parameter buffer. Each step is fused: one pass over params, grads and state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinew/core/pages.hpp"

namespace sinew::optim {

struct OptimizerOptions {
  std::string name = "sgd";  ///< "sgd" or "adam"
  float momentum = 0.9f;     ///< sgd: >= 0; 0 disables the momentum buffer
  float weight_decay = 0.f;  ///< L2 penalty added to the gradient: g + weight_decay * p; >= 0
  bool nesterov = false;     ///< sgd: Nesterov momentum (needs momentum > 0)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  ///< adam: betas in [0, 1), eps >= 0
};

/// How a sharded optimiser's state buffers are made (train/shards.hpp). By default (`overwritten` false) they
/// hold what a first step expects (zeros). A reshard's are `overwritten`: every element is written from the
/// old layout's state before anything reads it, so they need no initial values, and element 0 of state
/// buffer k is best placed at a byte address congruent to `page_offset[k]` modulo the page size: the whole
/// pages the member keeps of its old buffer can then move into the new one instead of being copied into
/// memory taken fresh (core/pages.hpp move_floats). An optimiser that cannot place its buffers ignores it.
struct StatePlacement {
  bool overwritten = false;
  std::vector<std::size_t> page_offset;  ///< per state buffer, in the order of state(); empty: anywhere
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  [[nodiscard]] virtual std::string name() const = 0;
  /// Updates params in place from grads with learning rate lr (>= 0) and increments steps().
  /// Throws InvalidArgument if the sizes differ from the size the optimizer was made for.
  virtual void step(std::span<float> params, std::span<const float> grads, float lr) = 0;
  /// Named state buffers, each as large as the parameters, in a fixed order: for checkpoints and for
  /// synchronising state between ranks. Writing through the spans changes the optimizer's state.
  virtual std::vector<std::pair<std::string, std::span<float>>> state() = 0;

  /// Steps taken so far (Adam's bias correction depends on it); restored from checkpoints by set_steps().
  [[nodiscard]] std::int64_t steps() const { return steps_; }
  /// (Virtual: an optimiser that keeps its own count elsewhere, a script's torch.optim one, follows.)
  virtual void set_steps(std::int64_t steps);

 protected:
  Optimizer() = default;
  Optimizer(const Optimizer&) = default;
  Optimizer& operator=(const Optimizer&) = default;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;
  /// Checks sizes and lr before a step.
  void check_step(std::span<float> params, std::span<const float> grads, float lr,
                  std::size_t expected) const;

  std::int64_t steps_ = 0;
};

/// PyTorch torch.optim.SGD semantics (dampening 0): g' = g + wd*p; with momentum m > 0,
/// buf = m*buf + g' (buf starts at 0, so the first step gives buf = g' exactly as PyTorch does) and the
/// update direction is buf, or g' + m*buf with Nesterov; without momentum it is g'. Then p -= lr * direction.
/// State: {"momentum"} when momentum > 0, otherwise none.
class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& opts, std::size_t num_params, const StatePlacement& place = {});
  [[nodiscard]] std::string name() const override { return "sgd"; }
  void step(std::span<float> params, std::span<const float> grads, float lr) override;
  std::vector<std::pair<std::string, std::span<float>>> state() override;

 private:
  float momentum_, weight_decay_;
  bool nesterov_;
  std::size_t num_params_;
  PlacedFloats buf_;
};

/// PyTorch torch.optim.Adam semantics (amsgrad off): g' = g + wd*p; m = b1*m + (1-b1)*g';
/// v = b2*v + (1-b2)*g'^2; with t = steps after the increment,
/// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). State: {"adam_m", "adam_v"}.
class Adam final : public Optimizer {
 public:
  Adam(const OptimizerOptions& opts, std::size_t num_params, const StatePlacement& place = {});
  [[nodiscard]] std::string name() const override { return "adam"; }
  void step(std::span<float> params, std::span<const float> grads, float lr) override;
  std::vector<std::pair<std::string, std::span<float>>> state() override;

 private:
  float beta1_, beta2_, eps_, weight_decay_;
  std::size_t num_params_;
  PlacedFloats m_;
  PlacedFloats v_;
};

/// "sgd" or "adam"; throws InvalidArgument for an unknown name or an out-of-range option. Their state is
/// core/pages.hpp memory, placed as `place` says.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& opts, std::size_t num_params,
                                          const StatePlacement& place = {});

}  // namespace sinew::optim
