// Monotonic timing helpers.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace sinew {

using Clock = std::chrono::steady_clock;

/// Seconds since `start` as a double.
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The median of `n` (odd) timings of `f`, in milliseconds: one step's computation for `--algorithm auto`.
inline double median_ms(int n, const std::function<void()>& f) {
  std::vector<double> ms;
  for (int i = 0; i < n; ++i) {
    const auto t = Clock::now();
    f();
    ms.push_back(seconds_since(t) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
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
