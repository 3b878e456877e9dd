// The student's side of distillation: teacher logits fetched by sample index ahead of the step that needs
// them, and what happens when they do not come (docs/distillation.md).
//
// The sampler's order is deterministic, so the trainer knows the samples of the next steps and asks for
// their logits early (prefetch); a few fetch threads keep requests in flight while the step computes. When
// the step comes, take() hands over what has arrived. A sample whose logits are missing after the wait
// that --distill-on-missing allows is trained on its label alone, and the step says so. A teacher failure
// is a ServiceError inside the source, never a rank failure: the MPI group does not notice it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "sinew/core/names.hpp"
#include "sinew/distill/source.hpp"

namespace sinew::distill {

/// --distill-on-missing: what a step does with samples whose teacher logits are late.
enum class OnMissing : std::uint8_t {
  kLabels,  ///< after --distill-timeout-ms, train those samples on their labels alone (logged per step)
  kWait,    ///< keep waiting (and asking again) up to --distill-max-wait-ms, then as kLabels
};
inline constexpr NameTable<OnMissing, 2> kOnMissingNames{
    {{OnMissing::kLabels, "labels"}, {OnMissing::kWait, "wait"}}};

struct DistillOptions {
  float alpha = 0.5f;                         ///< weight of the hard (label) term
  float temperature = 4.0f;                   ///< softens both distributions in the KL term
  std::chrono::milliseconds timeout{2000};    ///< deadline of one request; how long a step waits (kLabels)
  std::chrono::milliseconds max_wait{60000};  ///< kWait: the longest a step waits before using the labels
  OnMissing on_missing = OnMissing::kLabels;
  int fetch_threads = 2;  ///< requests in flight at once
};

/// What take() found for one step.
struct StepLogits {
  std::size_t samples = 0;  ///< asked for
  std::size_t missing = 0;  ///< without teacher logits (trained on labels alone)
  double wait_ms = 0;       ///< time the step waited for logits
  std::string reason;       ///< why some are missing (the source's last error), empty when none is
};

/// Running totals, for the metrics and the autoscaler.
struct DistillTotals {
  std::int64_t steps = 0, samples = 0, missing = 0, requests = 0, failed_requests = 0;
  std::int64_t failovers = 0;  ///< requests a teacher failed and another one answered
  double wait_ms = 0;
};

class Distiller {
 public:
  /// `dataset_size`: training samples (indices are < it). Throws InvalidArgument for bad options.
  Distiller(DistillOptions options, std::unique_ptr<LogitSource> source, std::size_t dataset_size);
  Distiller(const Distiller&) = delete;
  Distiller& operator=(const Distiller&) = delete;
  Distiller(Distiller&&) = delete;
  Distiller& operator=(Distiller&&) = delete;
  /// Stops the fetch threads; a request in flight ends by its deadline.
  ~Distiller();

  /// Asks for the logits of these samples now, as one request; samples asked for already are skipped.
  void prefetch(std::span<const std::size_t> indices);

  /// The teacher logits of a step's samples, waiting as the policy allows: `out` gets classes() x n
  /// (column-major), `has` a 1 for each sample whose logits are there (its column is zeros otherwise).
  /// Samples not asked for yet are asked for now.
  StepLogits take(std::span<const std::size_t> indices, std::vector<float>& out,
                  std::vector<std::uint8_t>& has);

  /// Called at the end of every step (its duration): feeds the source's report (the autoscaler's input).
  void step_done(double step_ms);

  [[nodiscard]] int classes() const noexcept { return classes_; }
  [[nodiscard]] const DistillOptions& options() const noexcept { return options_; }
  [[nodiscard]] std::string describe() const { return source_->describe(); }
  [[nodiscard]] DistillTotals totals() const;

 private:
  enum class Slot : std::uint8_t { kNone, kPending, kReady };
  struct Request {
    std::vector<std::size_t> indices;
  };
  void work();
  void enqueue(std::vector<std::size_t> indices, bool urgent);  // with mu_ held
  void fetch_now(std::span<const std::size_t> indices);         // synchronous sources

  DistillOptions options_;
  std::unique_ptr<LogitSource> source_;
  int classes_;
  mutable std::mutex mu_;
  std::condition_variable cv_;  // a request finished, or one was queued
  std::vector<Slot> slots_;
  std::vector<float> logits_;  // dataset_size x classes, filled as answers arrive
  std::deque<Request> queue_;
  std::string last_error_;
  DistillTotals totals_;
  // The window since the last report to the source.
  double window_wait_ms_ = 0, window_step_ms_ = 0;
  std::int64_t window_steps_ = 0, window_samples_ = 0, window_missing_ = 0;
  Clock::time_point window_start_ = Clock::now();
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace sinew::distill
