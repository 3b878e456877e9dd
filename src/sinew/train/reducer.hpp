// The gradient reduction of one step, as the loop reports it: which ranges of the workload's gradients
// arrived (each once), which never did, and the wait for the reduction, over the current view's bucketer
// (comm::Bucketer: host or device). The one place that checks what a caller reports: a range the workload
// does not list, a range reported twice, ranges never reported (--find-unused-parameters reduces them as
// zeros, as DDP's find_unused_parameters; otherwise the step fails naming the tensors), and a step in
// which no gradient arrived at all (no backward(): an error even with --find-unused-parameters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "sinew/comm/bucketer.hpp"
#include "sinew/core/flat.hpp"

namespace sinew::workload {
class Workload;
}

namespace sinew::train {

class Reducer {
 public:
  /// `first_ready` is called when the step's first range goes to the bucketer (the peers are then inside
  /// the reduction: a fault-injection point).
  Reducer(workload::Workload& work, bool find_unused, std::function<void()> first_ready);

  /// A new step, reduced over `bucketer` (the current view's; it changes after a change of membership).
  void begin(std::int64_t step, comm::Bucketer& bucketer);
  /// A range is final now, or once `ready` (an event on the compute stream) completes. Throws
  /// InvalidArgument for a range the workload does not list or one already reported in this step.
  void ready(Slice r, CUevent_st* ready = nullptr);
  /// Reduces the ranges never reported (or throws InvalidArgument, see above) and waits for the step's
  /// reduction. Idempotent within a step. May throw CommFailure/Timeout.
  void finish();
  /// finish() completed in this step.
  [[nodiscard]] bool finished() const noexcept { return finished_; }
  /// Milliseconds of the finished step's communication.
  [[nodiscard]] double comm_ms() const noexcept { return comm_ms_; }
  /// The names of the workload's tensors that overlap `r`, for messages ("fc2/weight, fc2/bias").
  [[nodiscard]] std::string tensors_in(Slice r) const;

 private:
  void send(Slice r, CUevent_st* ready);
  void unreported();

  workload::Workload& work_;
  bool find_unused_;
  std::function<void()> first_ready_;
  std::vector<Slice> ranges_;                                   // the workload's ready order
  std::vector<std::pair<std::size_t, std::size_t>> by_offset_;  // (offset, index in ranges_), sorted
  std::vector<std::uint8_t> reported_;                          // per range, this step
  comm::Bucketer* bucketer_ = nullptr;
  std::int64_t step_ = 0;
  bool any_sent_ = false;
  bool finished_ = false;
  double comm_ms_ = 0;
};

}  // namespace sinew::train
