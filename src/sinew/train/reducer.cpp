#include "sinew/train/reducer.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "sinew/core/error.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

Reducer::Reducer(workload::Workload& work, bool find_unused, std::function<void()> first_ready)
    : work_(work),
      find_unused_(find_unused),
      first_ready_(std::move(first_ready)),
      ranges_(work.ready_order()),
      reported_(ranges_.size(), 0) {
  for (std::size_t i = 0; i < ranges_.size(); ++i) by_offset_.emplace_back(ranges_[i].offset, i);
  std::sort(by_offset_.begin(), by_offset_.end());
}

void Reducer::begin(std::int64_t step, comm::Bucketer& bucketer) {
  bucketer_ = &bucketer;
  step_ = step;
  any_sent_ = false;
  finished_ = false;
  std::fill(reported_.begin(), reported_.end(), 0);
}

std::string Reducer::tensors_in(Slice r) const {
  std::string out;
  for (const auto& v : work_.views()) {
    if (v.offset < r.end() && r.offset < v.offset + v.count()) out += (out.empty() ? "" : ", ") + v.name;
  }
  return out.empty() ? fmt::format("[{}, {})", r.offset, r.end()) : out;
}

void Reducer::ready(Slice r, CUevent_st* ready) {
  const auto it = std::lower_bound(by_offset_.begin(), by_offset_.end(), std::pair{r.offset, std::size_t{0}});
  if (it == by_offset_.end() || it->first != r.offset || ranges_[it->second] != r) {
    SINEW_THROW(
        InvalidArgument,
        "a gradient range [{}, {}) was reported that is not one of the workload's ranges (ready_order())",
        r.offset, r.end());
  }
  if (reported_[it->second] != 0)
    SINEW_THROW(InvalidArgument, "the gradients of {} were reported twice in step {}", tensors_in(r), step_);
  reported_[it->second] = 1;
  send(r, ready);
}

void Reducer::send(Slice r, CUevent_st* ready) {
  SINEW_ENFORCE(bucketer_ != nullptr, "a gradient range reported outside a step");
  bucketer_->mark_ready(r, ready);
  if (!any_sent_) {
    any_sent_ = true;
    if (first_ready_) first_ready_();
  }
}

void Reducer::unreported() {
  std::vector<Slice> missing;
  for (std::size_t i = 0; i < ranges_.size(); ++i)
    if (reported_[i] == 0) missing.push_back(ranges_[i]);
  if (missing.empty()) return;
  if (missing.size() == ranges_.size()) {
    // Not one gradient in the step: no backward() ran (or it ran outside the step). Zeros would train on
    // nothing and look fine; with --find-unused-parameters too, this is an error.
    SINEW_THROW(
        InvalidArgument,
        "step {}: no gradient at all was reported: backward() was not called in this step (or its loss "
        "does not depend on the model's parameters)",
        step_);
  }
  if (!find_unused_) {
    std::string names;
    for (const Slice& r : missing) names += (names.empty() ? "" : "; ") + tensors_in(r);
    SINEW_THROW(
        InvalidArgument,
        "step {}: no gradient was reported for {} ({} of {} gradient ranges): parameters that take no "
        "part in the loss; give --find-unused-parameters to reduce them as zeros, or remove them from "
        "the model",
        step_, names, missing.size(), ranges_.size());
  }
  if (work_.on_device()) {
    SINEW_THROW(
        InvalidArgument,
        "step {}: no gradient was reported for {}; --find-unused-parameters works on gradients in host "
        "memory only",
        step_, tensors_in(missing.front()));
  }
  for (const Slice& r : missing) {
    const auto g = r.of(work_.grads());
    std::fill(g.begin(), g.end(), 0.f);
    send(r, nullptr);
  }
}

void Reducer::finish() {
  if (finished_) return;
  unreported();
  bucketer_->finish();
  comm_ms_ = bucketer_->last_comm_ms();
  finished_ = true;
}

}  // namespace sinew::train
