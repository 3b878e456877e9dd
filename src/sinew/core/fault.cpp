#include "sinew/core/fault.hpp"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "sinew/core/error.hpp"

namespace sinew::fault {

namespace {

template <class T>
bool parse_int(std::string_view s, T& out) {
  const auto* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end && !s.empty();
}

/// Points whose step is "this one or any later one".
bool from_then_on(Point p) {
  return p == Point::kRecovery || p == Point::kRecoveryHang || p == Point::kSpawn;
}

}  // namespace

Fault parse_fault(std::string_view spec, std::string_view option) {
  const auto a = spec.find(':'), b = spec.rfind(':');
  Fault f;
  bool ok = a != std::string_view::npos && a != b;
  if (ok) {
    const auto point = spec.substr(a + 1, b - a - 1);
    ok = is_name(kPointNames, point) && parse_int(spec.substr(0, a), f.rank) &&
         parse_int(spec.substr(b + 1), f.step);
    if (ok) f.point = parse_name(kPointNames, point, option);
  }
  if (!ok || f.rank < 0 || f.step < 1) {
    SINEW_THROW(InvalidArgument, "{}: '{}' is not RANK:POINT:STEP (RANK >= 0, STEP >= 1, POINT one of {})",
                option, spec, names_list(kPointNames));
  }
  return f;
}

Plan::Plan(const std::vector<Fault>& faults, int launch_rank, int restart_generation)
    : launch_rank_(launch_rank) {
  if (restart_generation > 0 || launch_rank < 0) return;
  for (auto f : faults) {
    if (f.rank != launch_rank) continue;
    if (f.point == Point::kCheckpointWrite) f.point = Point::kAfterShardData;
    faults_.push_back(f);
  }
}

void Plan::at(Point point, std::int64_t step) const {
  for (const auto& f : faults_) {
    if (f.point != point) continue;
    if (from_then_on(point) ? step < f.step : step != f.step) continue;
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (point == Point::kRecoveryHang) {
      fmt::print(stderr,
                 "[sinew] injected fault: launch rank {} stops at the start of a recovery at step {}, alive, "
                 "as a repair call that never returns (unix_time {:.6f})\n",
                 f.rank, step, now);
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
    fmt::print(stderr,
               "[sinew] injected fault: killing launch rank {} at phase {} of step {} (unix_time {:.6f})\n",
               f.rank, name_of(kPointNames, point), step, now);
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

}  // namespace sinew::fault
