// Distillation's glue in the session (--distill-*): the teacher built once, before the group's first
// collective; its logits asked for ahead by sample index (the sampler's order is known); a step's logits
// taken; the totals into the summary. Handed values (this rank's place, the samples ahead), never the
// session.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "sinew/train/config.hpp"
#include "sinew/train/summary.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::data {
class DistributedSampler;
}
namespace sinew::distill {
class Distiller;
}

namespace sinew::train {

/// Makes the teacher of --distill-*: called once, before the group's first collective, with this
/// process's launch rank and a thread-safe function returning its current {rank, size} in the group.
using DistillerFactory = std::function<std::unique_ptr<distill::Distiller>(
    int launch_rank, std::function<std::pair<int, int>()> place)>;

class TeacherFeed {
 public:
  /// Without --distill-* nothing; with it, `factory` builds the teacher (empty: InvalidArgument, this
  /// driver does not distil). `announce`: log which teacher.
  TeacherFeed(const Config& cfg, const DistillerFactory& factory, int launch_rank, int rank, int size,
              bool announce);
  TeacherFeed(const TeacherFeed&) = delete;
  TeacherFeed& operator=(const TeacherFeed&) = delete;
  TeacherFeed(TeacherFeed&&) = delete;
  TeacherFeed& operator=(TeacherFeed&&) = delete;
  ~TeacherFeed();

  [[nodiscard]] bool active() const noexcept { return distiller_ != nullptr; }
  /// A step begins at this rank's place in the group: asks for the teacher logits of its samples in the
  /// next --distill-prefetch steps (a resize makes some of them someone else's, which costs a request).
  void prefetch(const data::DistributedSampler& sampler, std::size_t train_size, int rank, int world,
                std::size_t step_total, std::size_t micro);
  /// Step `step`'s teacher targets for `indices`; `wait_ms` and `missing` get what it cost.
  workload::Teacher take(std::span<const std::size_t> indices, std::int64_t step, double& wait_ms,
                         std::int64_t& missing);
  void step_done(double step_ms);
  /// The totals into the summary (`log`: and a log line).
  void totals(Summary& sum, bool log) const;

 private:
  const Config& cfg_;
  // This rank's place, for the teacher service's balancer (read from its threads).
  std::atomic<int> rank_{0}, size_{1};
  std::unique_ptr<distill::Distiller> distiller_;
  std::vector<float> logits_;  // this micro-batch's teacher logits
  std::vector<std::uint8_t> has_;
};

}  // namespace sinew::train
