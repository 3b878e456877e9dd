// Monotonic timing helpers.
#pragma once

#include <chrono>

namespace sinew {

using Clock = std::chrono::steady_clock;

/// Seconds since `start` as a double.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// A stopwatch that accumulates the time spent between start() and stop().
class Stopwatch {
 public:
  void start() { begin_ = Clock::now(); }
  void stop() { total_ += Clock::now() - begin_; }
  void reset() { total_ = Clock::duration::zero(); }
  [[nodiscard]] double ms() const { return std::chrono::duration<double, std::milli>(total_).count(); }

 private:
  Clock::time_point begin_{};
  Clock::duration total_{};
};

}  // namespace sinew
