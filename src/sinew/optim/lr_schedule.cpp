#include "sinew/optim/lr_schedule.hpp"

#include <cmath>
#include <numbers>
#include <utility>

#include "sinew/core/error.hpp"

namespace sinew::optim {

LrSchedule::LrSchedule(LrScheduleOptions opts) : opts_(std::move(opts)) {
  const auto& o = opts_;
  // !(x >= 0) also rejects NaN.
  if (!(o.base_lr >= 0) || !std::isfinite(o.base_lr)) {
    SINEW_THROW(InvalidArgument, "lr schedule: base_lr must be finite and >= 0, got {}", o.base_lr);
  }
  if (o.warmup_steps < 0)
    SINEW_THROW(InvalidArgument, "lr schedule: warmup_steps must be >= 0, got {}", o.warmup_steps);
  if (o.kind == "constant") {
    kind_ = Kind::kConstant;
  } else if (o.kind == "step") {
    kind_ = Kind::kStep;
    if (o.step_size <= 0)
      SINEW_THROW(InvalidArgument, "lr schedule 'step': step_size must be > 0, got {}", o.step_size);
    if (!(o.gamma > 0) || !std::isfinite(o.gamma)) {
      SINEW_THROW(InvalidArgument, "lr schedule 'step': gamma must be finite and > 0, got {}", o.gamma);
    }
  } else if (o.kind == "cosine") {
    kind_ = Kind::kCosine;
    if (o.total_steps <= o.warmup_steps) {
      SINEW_THROW(InvalidArgument,
                  "lr schedule 'cosine': total_steps ({}) must be set and greater than warmup_steps ({})",
                  o.total_steps, o.warmup_steps);
    }
    if (!(o.min_lr >= 0) || !(o.min_lr <= o.base_lr)) {
      SINEW_THROW(InvalidArgument, "lr schedule 'cosine': min_lr must be in [0, base_lr = {}], got {}",
                  o.base_lr, o.min_lr);
    }
  } else {
    SINEW_THROW(InvalidArgument, "unknown lr schedule '{}'; valid kinds: constant, step, cosine", o.kind);
  }
}

float LrSchedule::lr(std::int64_t step) const {
  if (step < 0) SINEW_THROW(InvalidArgument, "lr schedule: step must be >= 0, got {}", step);
  const auto& o = opts_;
  const double base = o.base_lr;
  if (step < o.warmup_steps) {
    return static_cast<float>(base * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps));
  }
  const std::int64_t t = step - o.warmup_steps;  // decay is counted from the end of warm-up
  switch (kind_) {
    case Kind::kConstant:
      return o.base_lr;
    case Kind::kStep: {
      const std::int64_t decays = t / o.step_size;  // floor: whole periods completed
      return static_cast<float>(base * std::pow(static_cast<double>(o.gamma), static_cast<double>(decays)));
    }
    case Kind::kCosine: {
      const std::int64_t span = o.total_steps - o.warmup_steps;
      if (t >= span) return o.min_lr;
      const double progress = static_cast<double>(t) / static_cast<double>(span);
      const double min_lr = o.min_lr;
      return static_cast<float>(min_lr +
                                (base - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress)));
    }
  }
  return o.base_lr;  // unreachable: every kind is handled above
}

}  // namespace sinew::optim
