// Learning-rate schedules: optional linear warm-up, then constant, step decay or cosine annealing.
#pragma once

#include <cstdint>
#include <string>

namespace sinew::optim {

struct LrScheduleOptions {
  float base_lr = 0.1f;           ///< >= 0
  std::int64_t warmup_steps = 0;  ///< >= 0
  std::string kind = "constant";  ///< constant | step | cosine
  std::int64_t step_size = 1000;  ///< step: decay every step_size steps (> 0)
  float gamma = 0.1f;             ///< step: multiplicative decay (> 0)
  std::int64_t total_steps = 0;   ///< cosine: the step at which min_lr is reached (> warmup_steps)
  float min_lr = 0.f;             ///< cosine: final learning rate, in [0, base_lr]
};

/// lr(step) for step = 0, 1, 2, ... (the number of optimizer steps already taken):
///   step <  warmup_steps: base_lr * (step + 1) / warmup_steps, rising linearly from base_lr/warmup_steps
///                         to base_lr at step warmup_steps - 1;
///   afterwards, with t = step - warmup_steps (decay is counted from the end of warm-up):
///     constant: base_lr
///     step:     base_lr * gamma^floor(t / step_size)
///     cosine:   min_lr + (base_lr - min_lr) * (1 + cos(pi * t / T)) / 2 with T = total_steps - warmup_steps,
///               and min_lr for t >= T.
/// The constructor throws InvalidArgument for negative or non-finite values, an unknown kind, or a cosine
/// schedule whose total_steps does not exceed warmup_steps.
class LrSchedule {
 public:
  explicit LrSchedule(LrScheduleOptions opts);
  /// Throws InvalidArgument for a negative step.
  [[nodiscard]] float lr(std::int64_t step) const;
  [[nodiscard]] const LrScheduleOptions& options() const { return opts_; }

 private:
  enum class Kind { kConstant, kStep, kCosine };
  LrScheduleOptions opts_;
  Kind kind_ = Kind::kConstant;
};

}  // namespace sinew::optim
