#include "sinew/train/rescale.hpp"

#include <algorithm>
#include <cmath>

namespace sinew::train {

LrRescaler::LrRescaler(const Config& cfg, std::size_t dataset_size)
    : cfg_(cfg), dataset_size_(dataset_size) {}

std::size_t LrRescaler::step_batch(int world) const noexcept {
  return cfg_.global_batch > 0 ? cfg_.global_batch : static_cast<std::size_t>(world) * cfg_.batch_size;
}

void LrRescaler::start(Position& p, int world) const {
  p.launch_world = world;
  p.base_batch = static_cast<double>(step_batch(world));
  const double epoch_steps = std::ceil(static_cast<double>(dataset_size_) / p.base_batch);
  p.sched_total = static_cast<std::int64_t>(epoch_steps) * cfg_.epochs;
  if (cfg_.max_steps > 0) p.sched_total = std::min(p.sched_total, cfg_.max_steps);
}

void LrRescaler::build_schedule(const Position& p) {
  optim::LrScheduleOptions so;
  so.base_lr = cfg_.lr;
  so.warmup_steps = std::min(cfg_.warmup_steps, p.sched_total / 2);
  so.kind = cfg_.lr_schedule;
  so.step_size = cfg_.lr_step_size;
  so.gamma = cfg_.lr_gamma;
  so.total_steps = std::max<std::int64_t>(p.sched_total, 1);
  schedule_ = std::make_unique<optim::LrSchedule>(so);
}

double LrRescaler::factor(const Position& p, std::int64_t step) noexcept {
  const LrRamp& r = p.ramp;
  if (r.steps <= 0 || step >= r.start + r.steps) return r.factor_to;
  const double a = static_cast<double>(step - r.start) / static_cast<double>(r.steps);
  return r.factor_from + (r.factor_to - r.factor_from) * std::max(0.0, a);
}

float LrRescaler::lr(const Position& p) const {
  const double consumed =
      static_cast<double>(p.epoch) * static_cast<double>(dataset_size_) + static_cast<double>(p.cursor);
  const auto at = static_cast<std::int64_t>(consumed / p.base_batch);
  return static_cast<float>(schedule_->lr(at) * factor(p, p.step));
}

RescaleEvent LrRescaler::rescale(Position& p, int from_world, int world, const char* why) const {
  const double ratio = static_cast<double>(step_batch(world)) / p.base_batch;
  double f = 1;
  if (cfg_.lr_scaling == LrScaling::kLinear) f = ratio;
  if (cfg_.lr_scaling == LrScaling::kSqrt) f = std::sqrt(ratio);
  const double now = factor(p, p.step);
  p.ramp = {now, f, p.step, f > now ? cfg_.rescale_ramp_steps : 0};
  const std::size_t micro = static_cast<std::size_t>(world) * cfg_.batch_size;
  RescaleEvent e;
  e.reason = why;
  e.lr_scaling = name_of(kLrScalingNames, cfg_.lr_scaling);
  e.step = p.step;
  e.from_world_size = from_world;
  e.world_size = world;
  e.global_batch = step_batch(world);
  e.accumulation = (step_batch(world) + micro - 1) / micro;
  e.lr_factor_from = now;
  e.lr_factor_to = f;
  e.ramp_steps = p.ramp.steps;
  return e;
}

}  // namespace sinew::train
