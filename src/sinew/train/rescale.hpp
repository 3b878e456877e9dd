// The learning rate over a run whose size changes (--lr-scaling, --rescale-ramp-steps, --global-batch).
//
// The schedule (warm-up, then constant/step/cosine) runs on samples consumed, counted in steps of the
// reference global batch (the launch size's), so that a resize neither stretches nor cuts it. After every
// resize a factor follows the new global batch (linear or sqrt scaling): reached at once when it goes
// down, over --rescale-ramp-steps when it goes up. The factor's ramp lives in the replicated Position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "sinew/optim/lr_schedule.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/events.hpp"
#include "sinew/train/replicated_state.hpp"

namespace sinew::train {

class LrRescaler {
 public:
  LrRescaler(const Config& cfg, std::size_t dataset_size);

  /// Samples per optimiser step at `world` ranks.
  [[nodiscard]] std::size_t step_batch(int world) const noexcept;

  /// Sets the reference (launch size, schedule length) of a run that starts or resumes at `world` ranks.
  void start(Position& p, int world) const;
  /// Builds the schedule from p.sched_total (after start(), or after a replacement synchronised).
  void build_schedule(const Position& p);

  /// The learning rate of the next step.
  [[nodiscard]] float lr(const Position& p) const;

  /// After a resize from `from_world` to `world` ranks: sets the new factor's ramp in `p` and returns the
  /// event that says so.
  RescaleEvent rescale(Position& p, int from_world, int world, const char* why) const;

 private:
  [[nodiscard]] static double factor(const Position& p, std::int64_t step) noexcept;

  const Config& cfg_;
  std::size_t dataset_size_;
  std::unique_ptr<optim::LrSchedule> schedule_;
};

}  // namespace sinew::train
