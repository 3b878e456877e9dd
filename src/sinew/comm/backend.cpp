#include "sinew/comm/backend.hpp"

#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::comm {

void poll_until_complete(Work& w, std::chrono::milliseconds timeout, std::string_view what,
                         const std::uint64_t* progress) {
  const auto start = Clock::now();
  // Saturating: a timeout past the clock's range (milliseconds::max()) means no deadline.
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - start);
  const auto deadline = timeout >= room ? Clock::time_point::max() : start + timeout;
  auto phase = start;  // when the last progress was seen
  std::uint64_t seen = progress != nullptr ? *progress : 0;
  for (int spins = 0;; ++spins) {
    if (w.test()) return;
    if (progress != nullptr && *progress != seen) {
      seen = *progress;
      phase = Clock::now();
      spins = 0;
      continue;
    }
    if (spins > 64) {
      const auto now = Clock::now();
      if (now > deadline) {
        SINEW_THROW(Timeout, "{} did not complete within {} ms; a peer is dead, stopped or far behind", what,
                    timeout.count());
      }
      // A long wait (a slow link, a peer still computing) polls less often, leaving the core to the
      // ranks and threads that share it; a short one stays responsive.
      if (now - phase > std::chrono::milliseconds(2)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::yield();
      }
    }
  }
}

std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
    case DType::kUInt64:
      return 8;
    case DType::kUInt8:
      return 1;
  }
  return 1;
}

}  // namespace sinew::comm
