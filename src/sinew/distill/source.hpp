// Where a student's teacher logits come from (docs/distillation.md): the teacher service (serve/), a
// teacher computed inside the student's process, or a precomputed table. The Distiller (distiller.hpp)
// asks a source for the logits of training samples by index, ahead of the step that needs them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace sinew::distill {

using Clock = std::chrono::steady_clock;

/// How the student fared over the last window (about a second of steps): the autoscaler's input.
struct StudentReport {
  double wait_ms_per_step = 0;  ///< time a step waited for teacher logits
  double step_ms = 0;           ///< mean step time, waiting included
  double samples_per_s = 0;     ///< this student's samples (teacher requests) per second
  double missing_fraction = 0;  ///< of its samples trained on labels alone
};

class LogitSource {
 public:
  LogitSource() = default;
  LogitSource(const LogitSource&) = delete;
  LogitSource& operator=(const LogitSource&) = delete;
  LogitSource(LogitSource&&) = delete;
  LogitSource& operator=(LogitSource&&) = delete;
  virtual ~LogitSource() = default;

  /// The logits of the training samples `indices`, classes() x indices.size() column-major (one column per
  /// sample), into `out` (resized). Blocks until done or `deadline`; thread-safe (the Distiller calls it
  /// from several threads at once). Throws ServiceError when no teacher answered in time or an answer was
  /// unusable, naming the cause.
  virtual void fetch(std::span<const std::size_t> indices, Clock::time_point deadline,
                     std::vector<float>& out) = 0;

  /// Rows of the logits (the teacher's classes).
  [[nodiscard]] virtual int classes() const = 0;

  /// true: fetch() computes in the caller's thread (the teacher inside the student's process), so asking
  /// ahead of time gains nothing; the Distiller calls it when the step needs the logits.
  [[nodiscard]] virtual bool synchronous() const { return false; }

  /// The student's latest window, published where the autoscaler reads it (the service's registry); the
  /// other sources ignore it. Must not block for long (the training thread calls it about once a second).
  virtual void report(const StudentReport& /*report*/) {}

  /// Requests that a teacher failed and another one answered (the service's failovers); 0 for the others.
  [[nodiscard]] virtual std::int64_t failovers() const { return 0; }

  /// One line for logs: "teacher service job/x (2 teachers)", "table t.h5", ...
  [[nodiscard]] virtual std::string describe() const = 0;
};

/// What a student needs to reach its job's teacher service.
struct ServiceSpec {
  std::string registry;          ///< etcd endpoint
  std::string job;               ///< registry prefix /sinew/<job>/
  std::string token;             ///< the job token
  std::string dataset;           ///< the student's data set fingerprint (data::fingerprint)
  std::size_t dataset_size = 0;  ///< training samples
  int classes = 0;               ///< the data set's classes (teachers must have as many)
  std::string student;           ///< this student's name in the registry (unique in the job)
  /// (rank, size) of this student in its group now; called from the fetch threads (must be thread-safe).
  std::function<std::pair<int, int>()> position;
};

/// Makes the teacher service's source (serve::service_source): given to the trainer by sinew-train, so
/// that libsinew itself does not depend on gRPC. Empty: this program has no teacher service.
using ServiceFactory = std::function<std::unique_ptr<LogitSource>(const ServiceSpec&)>;

}  // namespace sinew::distill
