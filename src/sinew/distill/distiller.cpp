#include "sinew/distill/distiller.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "sinew/core/error.hpp"

namespace sinew::distill {

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

Distiller::Distiller(DistillOptions options, std::unique_ptr<LogitSource> source, std::size_t dataset_size)
    : options_(options), source_(std::move(source)), classes_(source_ ? source_->classes() : 0) {
  if (!source_) SINEW_THROW(InvalidArgument, "distillation needs a teacher (a logit source)");
  if (!(options_.alpha >= 0.f && options_.alpha <= 1.f)) {
    SINEW_THROW(InvalidArgument, "--distill-alpha must lie in [0, 1], got {}", options_.alpha);
  }
  if (!(options_.temperature > 0.f)) {
    SINEW_THROW(InvalidArgument, "--distill-temperature must be > 0, got {}", options_.temperature);
  }
  if (options_.timeout.count() <= 0) {
    SINEW_THROW(InvalidArgument, "--distill-timeout-ms must be > 0, got {}", options_.timeout.count());
  }
  if (classes_ <= 0) SINEW_THROW(InvalidArgument, "the teacher ({}) has no classes", source_->describe());
  slots_.assign(dataset_size, Slot::kNone);
  logits_.assign(dataset_size * static_cast<std::size_t>(classes_), 0.f);
  if (!source_->synchronous()) {
    const int n = std::max(1, options_.fetch_threads);
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { work(); });
  }
}

Distiller::~Distiller() {
  {
    const std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void Distiller::enqueue(std::vector<std::size_t> indices, bool urgent) {
  for (const std::size_t i : indices) slots_[i] = Slot::kPending;
  ++totals_.requests;
  if (urgent) {
    queue_.push_front({std::move(indices)});
  } else {
    queue_.push_back({std::move(indices)});
  }
  cv_.notify_all();
}

void Distiller::prefetch(std::span<const std::size_t> indices) {
  if (source_->synchronous()) return;  // nothing to gain: it computes in this thread anyway
  std::vector<std::size_t> want;
  const std::lock_guard lock(mu_);
  for (const std::size_t i : indices) {
    if (i >= slots_.size()) SINEW_THROW(InvalidArgument, "distillation: sample {} of {}", i, slots_.size());
    if (slots_[i] == Slot::kNone) want.push_back(i);
  }
  if (!want.empty()) enqueue(std::move(want), /*urgent=*/false);
}

void Distiller::work() {
  std::vector<float> out;
  for (;;) {
    Request r;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      r = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error;
    try {
      source_->fetch(r.indices, Clock::now() + options_.timeout, out);
      if (out.size() != r.indices.size() * static_cast<std::size_t>(classes_)) {
        SINEW_THROW(ServiceError, "the teacher answered {} logits for {} samples of {} classes", out.size(),
                    r.indices.size(), classes_);
      }
    } catch (const ServiceError& e) {
      error = e.message();
    }
    {
      const std::lock_guard lock(mu_);
      const auto c = static_cast<std::size_t>(classes_);
      for (std::size_t k = 0; k < r.indices.size(); ++k) {
        const std::size_t i = r.indices[k];
        if (!error.empty()) {
          slots_[i] = Slot::kNone;
          continue;
        }
        std::memcpy(logits_.data() + i * c, out.data() + k * c, c * sizeof(float));
        slots_[i] = Slot::kReady;
      }
      if (!error.empty()) {
        ++totals_.failed_requests;
        if (error != last_error_) spdlog::warn("distillation: {}", error);
        last_error_ = error;
      }
    }
    cv_.notify_all();
  }
}

void Distiller::fetch_now(std::span<const std::size_t> indices) {
  std::vector<float> out;
  ++totals_.requests;
  try {
    source_->fetch(indices, Clock::now() + options_.timeout, out);
    const auto c = static_cast<std::size_t>(classes_);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      std::memcpy(logits_.data() + indices[k] * c, out.data() + k * c, c * sizeof(float));
      slots_[indices[k]] = Slot::kReady;
    }
  } catch (const ServiceError& e) {
    ++totals_.failed_requests;
    last_error_ = e.message();
  }
}

StepLogits Distiller::take(std::span<const std::size_t> indices, std::vector<float>& out,
                           std::vector<std::uint8_t>& has) {
  const auto c = static_cast<std::size_t>(classes_);
  const auto t0 = Clock::now();
  StepLogits r;
  r.samples = indices.size();
  out.assign(indices.size() * c, 0.f);
  has.assign(indices.size(), 0);
  std::unique_lock lock(mu_);
  auto ask_missing = [&] {
    std::vector<std::size_t> want;
    for (const std::size_t i : indices) {
      if (i >= slots_.size()) SINEW_THROW(InvalidArgument, "distillation: sample {} of {}", i, slots_.size());
      if (slots_[i] == Slot::kNone) want.push_back(i);
    }
    if (want.empty()) return;
    if (source_->synchronous()) {
      fetch_now(want);
    } else {
      enqueue(std::move(want), /*urgent=*/true);
    }
  };
  auto all_ready = [&] {
    return std::all_of(indices.begin(), indices.end(),
                       [&](std::size_t i) { return slots_[i] == Slot::kReady; });
  };
  last_error_.clear();
  ask_missing();
  const auto give_up =
      t0 + (options_.on_missing == OnMissing::kWait ? std::max(options_.max_wait, options_.timeout)
                                                    : options_.timeout);
  auto next_note = t0 + options_.timeout;
  while (!all_ready() && !source_->synchronous()) {
    const auto now = Clock::now();
    if (now >= give_up) break;
    if (options_.on_missing == OnMissing::kLabels && !last_error_.empty()) {
      // The source tried every teacher it knows within the request's deadline: waiting longer will not help.
      const bool any_pending = std::any_of(indices.begin(), indices.end(),
                                           [&](std::size_t i) { return slots_[i] == Slot::kPending; });
      if (!any_pending) break;
    }
    if (options_.on_missing == OnMissing::kWait) {
      if (now >= next_note) {
        spdlog::warn("distillation: waiting {:.1f} s for teacher logits{}{}", ms_between(t0, now) / 1e3,
                     last_error_.empty() ? "" : ": ", last_error_);
        next_note = now + options_.timeout;
      }
      ask_missing();  // ask again for what failed
    }
    cv_.wait_until(lock, std::min(give_up, now + std::chrono::milliseconds(100)));
  }
  for (std::size_t k = 0; k < indices.size(); ++k) {
    const std::size_t i = indices[k];
    if (slots_[i] != Slot::kReady) {
      ++r.missing;
      continue;
    }
    std::memcpy(out.data() + k * c, logits_.data() + i * c, c * sizeof(float));
    has[k] = 1;
    slots_[i] = Slot::kNone;  // used: a later epoch asks again (as it would with data augmentation)
  }
  r.wait_ms = ms_between(t0, Clock::now());
  if (r.missing > 0) r.reason = last_error_.empty() ? "no answer within the wait allowed" : last_error_;
  ++totals_.steps;
  totals_.samples += static_cast<std::int64_t>(r.samples);
  totals_.missing += static_cast<std::int64_t>(r.missing);
  totals_.wait_ms += r.wait_ms;
  window_wait_ms_ += r.wait_ms;
  window_samples_ += static_cast<std::int64_t>(r.samples);
  window_missing_ += static_cast<std::int64_t>(r.missing);
  return r;
}

void Distiller::step_done(double step_ms) {
  StudentReport rep;
  {
    const std::lock_guard lock(mu_);
    window_step_ms_ += step_ms;
    ++window_steps_;
    const double span_ms = ms_between(window_start_, Clock::now());
    if (span_ms < 1000) return;
    const auto steps = static_cast<double>(window_steps_);
    rep.wait_ms_per_step = window_wait_ms_ / steps;
    rep.step_ms = window_step_ms_ / steps;
    rep.samples_per_s = static_cast<double>(window_samples_) / (span_ms / 1e3);
    rep.missing_fraction = window_samples_ > 0
                               ? static_cast<double>(window_missing_) / static_cast<double>(window_samples_)
                               : 0.0;
    window_wait_ms_ = window_step_ms_ = 0;
    window_steps_ = window_samples_ = window_missing_ = 0;
    window_start_ = Clock::now();
  }
  source_->report(rep);
}

DistillTotals Distiller::totals() const {
  const std::lock_guard lock(mu_);
  DistillTotals t = totals_;
  t.failovers = source_->failovers();
  return t;
}

}  // namespace sinew::distill
