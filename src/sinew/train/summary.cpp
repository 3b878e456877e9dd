#include "sinew/train/summary.hpp"

#include <nlohmann/json.hpp>

#include "sinew/core/error.hpp"

namespace sinew::train {

int Summary::exit_code() const noexcept {
  if (left) return static_cast<int>(ExitCode::kOk);
  if (below_min_ranks || stopped_by_signal != 0) return static_cast<int>(ExitCode::kRelaunch);
  if (!checkpoint_error.empty()) return static_cast<int>(ExitCode::kCheckpoint);
  return static_cast<int>(ExitCode::kOk);
}

nlohmann::json to_json(const Summary& s) {
  nlohmann::json j = {{"event", "done"},
                      {"test_accuracy", s.test_accuracy},
                      {"test_loss", s.test_loss},
                      {"train_loss", s.train_loss},
                      {"steps", s.steps},
                      {"epochs", s.epochs},
                      {"samples", s.samples},
                      {"world_size", s.world_size},
                      {"failures", s.failures},
                      {"wall_s", s.wall_s},
                      {"step_ms", s.step_ms},
                      {"comm_ms", s.comm_ms},
                      {"samples_per_s", s.samples_per_s},
                      {"train_s", s.train_s},
                      {"algorithm", s.algorithm},
                      {"bytes_sent_per_step", s.bytes_sent_per_step},
                      {"stopped_by_signal", s.stopped_by_signal},
                      {"below_min_ranks", s.below_min_ranks},
                      {"checkpoint_error", s.checkpoint_error}};
  if (!s.teacher.empty()) {
    j["teacher"] = s.teacher;
    j["distill_wait_ms_per_step"] = s.distill_wait_ms_per_step;
    j["distill_missing"] = s.distill_missing;
    j["distill_failed_requests"] = s.distill_failed_requests;
    j["distill_failovers"] = s.distill_failovers;
  }
  return j;
}

}  // namespace sinew::train
