#include "sinew/train/run_metrics.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>

namespace sinew::train {

void RunMetrics::started(const StartEvent& e, const std::string& what, std::size_t train_size,
                         bool announce) {
  t0_ = Clock::now();
  if (!announce) return;
  spdlog::info("training {} on {} ({} train samples), {} ranks x batch {}, {} steps", what, e.dataset,
               train_size, e.world_size, e.batch_size, e.steps);
  events_.emit(e);
}

double RunMetrics::step_done(const StepFigures& f) {
  window_.step_ms += f.step_ms;
  window_.comm_ms += f.comm_ms;
  window_.loss += f.local_loss;
  window_.samples += f.samples;
  window_.bytes_sent += f.bytes_sent;
  ++window_.steps;
  total_step_ms_ += f.step_ms;
  total_comm_ms_ += f.comm_ms;
  ++total_steps_;
  sum_.samples += f.samples;
  sum_.bytes_sent += f.bytes_sent;
  if (!pending_) return -1;
  // The first step after a recovery completed: the recovery is over.
  pending_->event.first_step_ms = f.step_ms;
  pending_->event.total_ms = seconds_since(pending_->detected) * 1e3;
  pending_->event.step = f.step;
  events_.emit(pending_->event);
  const double ms = pending_->event.total_ms;
  pending_.reset();
  return ms;
}

bool RunMetrics::window_due(std::int64_t step, bool epoch_end) const {
  return step % cfg_.log_every == 0 || epoch_end || (cfg_.max_steps > 0 && step >= cfg_.max_steps);
}

void RunMetrics::report(comm::Backend& backend, const comm::Options& op, const Place& at, bool distilling) {
  // Each rank's loss share sums to the global mean loss; the distillation figures sum over the ranks.
  double agg[3] = {window_.loss, window_.distill_wait_ms, static_cast<double>(window_.distill_missing)};
  backend.allreduce_sync(comm::Buffer::of(std::span<double>(agg)), comm::ReduceOp::kSum, op);
  const auto steps = static_cast<double>(window_.steps);
  const double mean_loss = agg[0] / steps;
  sum_.train_loss = mean_loss;
  const double sps = static_cast<double>(window_.samples) / (window_.step_ms / 1e3);
  StepEvent e;
  e.step = at.step;
  e.epoch = at.epoch;
  e.world_size = at.world_size;
  e.loss = mean_loss;
  e.lr = at.lr;
  e.samples_per_s = std::round(sps);
  e.step_ms = window_.step_ms / steps;
  e.comm_ms = window_.comm_ms / steps;
  e.exposed_comm_ms = at.exposed_comm_ms;
  e.bytes_sent_per_step = static_cast<double>(window_.bytes_sent) / steps;
  if (distilling) {
    e.distilling = true;
    e.distill_wait_ms = agg[1] / steps / static_cast<double>(at.world_size);
    e.distill_missing = static_cast<std::int64_t>(agg[2]);
  }
  events_.emit(e);
  if (at.rank == 0 && cfg_.progress && seconds_since(last_progress_) > 2.0) {
    last_progress_ = Clock::now();
    const double eta =
        (total_step_ms_ / static_cast<double>(total_steps_)) * static_cast<double>(at.steps_left) / 1e3;
    // A script's own loop does not give its loss (NaN): the line leaves it out rather than print a zero.
    const std::string loss = std::isfinite(mean_loss) ? fmt::format(" loss {:.4f}", mean_loss) : "";
    spdlog::info("epoch {}/{} step {}/{}{} lr {:.4g} {} ranks {:.0f} samples/s ETA {:.0f}s", at.epoch + 1,
                 at.epochs, at.step, at.step + at.steps_left, loss, at.lr, at.world_size, sps, eta);
  }
  window_ = {};
}

void RunMetrics::recovering(Clock::time_point detected, const RecoveredEvent& event) {
  window_ = {};
  pending_ = PendingRecovery{detected, event};
}

Summary& RunMetrics::done(std::int64_t steps, int world_size, const std::string& algorithm) {
  sum_.steps = steps;
  sum_.world_size = world_size;
  sum_.wall_s = seconds_since(t0_);
  const auto n = static_cast<double>(total_steps_);
  sum_.step_ms = total_steps_ > 0 ? total_step_ms_ / n : 0;
  sum_.comm_ms = total_steps_ > 0 ? total_comm_ms_ / n : 0;
  sum_.samples_per_s = std::round(static_cast<double>(sum_.samples) / (total_step_ms_ / 1e3));
  sum_.train_s = total_step_ms_ / 1e3;
  sum_.algorithm = algorithm;
  sum_.bytes_sent_per_step =
      steps > 0 ? static_cast<double>(sum_.bytes_sent) / static_cast<double>(steps) : 0.0;
  return sum_;
}

}  // namespace sinew::train
