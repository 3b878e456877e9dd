#include "sinew/train/teacher_feed.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "sinew/core/error.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/distill/distiller.hpp"

namespace sinew::train {

TeacherFeed::TeacherFeed(const Config& cfg, const DistillerFactory& factory, int launch_rank, int rank,
                         int size, bool announce)
    : cfg_(cfg), rank_(rank), size_(size) {
  if (!distilling(cfg)) return;
  if (!factory) SINEW_THROW(InvalidArgument, "--distill-*: this driver of the training loop does not distil");
  distiller_ = factory(launch_rank, [this] { return std::pair{rank_.load(), size_.load()}; });
  if (announce)
    spdlog::info("distilling from {} (alpha {}, T {})", distiller_->describe(), cfg.distill_alpha,
                 cfg.distill_temperature);
}

TeacherFeed::~TeacherFeed() = default;

void TeacherFeed::prefetch(const data::DistributedSampler& sampler, std::size_t train_size, int rank,
                           int world, std::size_t step_total, std::size_t micro) {
  rank_ = rank;
  size_ = world;
  if (!distiller_ || cfg_.distill_prefetch == 0) return;
  const std::size_t remaining = train_size - sampler.cursor();
  for (int d = 0; d <= cfg_.distill_prefetch; ++d) {  // d = 0: this step, first in the queue
    const std::size_t off = static_cast<std::size_t>(d) * step_total;
    if (off >= remaining) break;
    const std::size_t g = std::min(step_total, remaining - off);
    for (std::size_t j = 0; j < g; j += micro)
      distiller_->prefetch(sampler.peek_range(rank, world, off + j, std::min(micro, g - j)).indices);
  }
}

workload::Teacher TeacherFeed::take(std::span<const std::size_t> indices, std::int64_t step, double& wait_ms,
                                    std::int64_t& missing) {
  SINEW_ENFORCE(distiller_ != nullptr, "teacher() without a --distill-* source");
  const auto got = distiller_->take(indices, logits_, has_);
  wait_ms = got.wait_ms;
  missing = static_cast<std::int64_t>(got.missing);
  if (got.missing > 0) {
    spdlog::warn(
        "step {}: {} of {} samples trained on their labels alone (no teacher logits after {:.0f} ms: {})",
        step, got.missing, got.samples, got.wait_ms, got.reason);
  }
  return {logits_, has_, cfg_.distill_alpha, cfg_.distill_temperature};
}

void TeacherFeed::step_done(double step_ms) {
  if (distiller_) distiller_->step_done(step_ms);
}

void TeacherFeed::totals(Summary& sum, bool log) const {
  if (!distiller_) return;
  const auto t = distiller_->totals();
  sum.teacher = distiller_->describe();
  sum.distill_wait_ms_per_step = t.steps > 0 ? t.wait_ms / static_cast<double>(t.steps) : 0.0;
  sum.distill_missing = t.missing;
  sum.distill_failed_requests = t.failed_requests;
  sum.distill_failovers = t.failovers;
  if (log) {
    spdlog::info(
        "distillation: {:.2f} ms per step waiting for teacher logits, {} samples on labels alone, {} "
        "requests "
        "failed over to another teacher, {} failed (rank 0)",
        sum.distill_wait_ms_per_step, t.missing, t.failovers, t.failed_requests);
  }
}

}  // namespace sinew::train
