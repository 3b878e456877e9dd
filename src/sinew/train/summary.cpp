#include "sinew/train/summary.hpp"

#include "sinew/core/error.hpp"

namespace sinew::train {

int Summary::exit_code() const noexcept {
  if (left) return static_cast<int>(ExitCode::kOk);
  if (below_min_ranks || stopped_by_signal != 0) return static_cast<int>(ExitCode::kRelaunch);
  if (!checkpoint_error.empty()) return static_cast<int>(ExitCode::kCheckpoint);
  return static_cast<int>(ExitCode::kOk);
}

}  // namespace sinew::train
