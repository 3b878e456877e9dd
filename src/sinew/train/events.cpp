#include "sinew/train/events.hpp"

#include <cmath>
#include <utility>

namespace sinew::train {

using nlohmann::json;

json to_json(const StartEvent& e) {
  return {{"event", "start"},
          {"world_size", e.world_size},
          {"model", e.model},
          {"dataset", e.dataset},
          {"params", e.params},
          {"batch_size", e.batch_size},
          {"global_batch", e.global_batch},
          {"steps", e.steps},
          {"buckets", e.buckets},
          {"elastic", e.elastic},
          {"spares", e.spares},
          {"mpi", e.mpi},
          {"ulfm", e.ulfm}};
}

json to_json(const StepEvent& e) {
  json j = {{"step", e.step},
            {"epoch", e.epoch},
            {"world_size", e.world_size},
            {"loss", std::isfinite(e.loss) ? json(e.loss) : json(nullptr)},  // null: not known
            {"lr", e.lr},
            {"samples_per_s", e.samples_per_s},
            {"step_ms", e.step_ms},
            {"comm_ms", e.comm_ms},
            {"exposed_comm_ms", e.exposed_comm_ms},
            {"bytes_sent_per_step", e.bytes_sent_per_step}};
  if (e.distilling) {
    j["distill_wait_ms"] = e.distill_wait_ms;
    j["distill_missing"] = e.distill_missing;
  }
  return j;
}

json to_json(const EvalEvent& e) {
  return {{"event", "eval"},
          {"epoch", e.epoch},
          {"step", e.step},
          {"world_size", e.world_size},
          {"test_accuracy", e.test_accuracy},
          {"test_loss", e.test_loss}};
}

json to_json(const CheckpointEvent& e) {
  if (!e.error.empty())
    return {{"event", "checkpoint"}, {"step", e.step}, {"reason", e.reason}, {"error", e.error}};
  return {{"event", "checkpoint"},    {"step", e.step},
          {"path", e.path},           {"reason", e.reason},
          {"bytes", e.bytes},         {"write_ms", e.write_ms},
          {"commit_ms", e.commit_ms}, {"world_size", e.world_size}};
}

json to_json(const ResumeEvent& e) {
  return {{"event", "resume"},
          {"path", e.path},
          {"step", e.step},
          {"epoch", e.epoch},
          {"cursor", e.cursor},
          {"from_world_size", e.from_world_size},
          {"world_size", e.world_size},
          {"load_ms", e.load_ms},
          {"generation", e.generation},
          {"skipped", e.skipped},
          {"steps_lost", e.steps_lost},
          {"waited_s", e.waited_s}};
}

json to_json(const FailureEvent& e) {
  json j = {{"event", "failure"},
            {"step", e.step},
            {"error", e.error},
            {"from_world_size", e.from_world_size},
            {"detected_unix_time", e.detected_unix_time},
            {"world_size", e.world_size},
            {"lost", e.lost},
            {"promoted", e.promoted},
            {"attempts", e.attempts},
            {"membership_epoch", e.membership_epoch},
            {"revoke_ms", e.revoke_ms},
            {"shrink_ms", e.shrink_ms},
            {"agree_ms", e.agree_ms},
            {"spawn_ms", e.spawn_ms},
            {"rebuild_ms", e.rebuild_ms},
            {"sync_ms", e.sync_ms},
            {"resumed_step", e.resumed_step},
            {"role", e.role}};
  if (e.reshard_ms >= 0) {
    j["reshard_ms"] = e.reshard_ms;
    j["reshard_moved_bytes"] = e.reshard_moved_bytes;
  }
  if (e.on_device) {
    j["nccl_abort_ms"] = e.nccl_abort_ms;
    j["nccl_init_ms"] = e.nccl_init_ms;
  }
  return j;
}

json to_json(const RecoveredEvent& e) {
  return {{"event", "recovered"},
          {"world_size", e.world_size},
          {"membership_epoch", e.membership_epoch},
          {"first_step_ms", e.first_step_ms},
          {"total_ms", e.total_ms},
          {"step", e.step}};
}

json to_json(const ShrinkEvent& e) {
  json j = {{"event", "shrink"},
            {"reason", e.reason},
            {"step", e.step},
            {"from_world_size", e.from_world_size},
            {"world_size", e.world_size},
            {"membership_epoch", e.membership_epoch}};
  if (!e.why.empty()) j["why"] = e.why;
  if (e.ms >= 0) j["ms"] = e.ms;
  return j;
}

json to_json(const GrowEvent& e) {
  if (!e.error.empty()) {
    return {{"event", "grow"},
            {"reason", e.reason},
            {"step", e.step},
            {"from_world_size", e.from_world_size},
            {"world_size", e.world_size},
            {"error", e.error}};
  }
  return {{"event", "grow"},
          {"reason", e.reason},
          {"step", e.step},
          {"from_world_size", e.from_world_size},
          {"world_size", e.world_size},
          {"membership_epoch", e.membership_epoch},
          {"spawn_ms", e.spawn_ms},
          {"merge_ms", e.merge_ms},
          {"rebuild_ms", e.rebuild_ms},
          {"sync_ms", e.sync_ms},
          {"promoted", e.promoted},
          {"ms", e.ms}};
}

json to_json(const RescaleEvent& e) {
  return {{"event", "rescale"},
          {"reason", e.reason},
          {"step", e.step},
          {"from_world_size", e.from_world_size},
          {"world_size", e.world_size},
          {"lr_scaling", e.lr_scaling},
          {"global_batch", e.global_batch},
          {"accumulation", e.accumulation},
          {"lr_factor_from", e.lr_factor_from},
          {"lr_factor_to", e.lr_factor_to},
          {"ramp_steps", e.ramp_steps}};
}

json to_json(const AlgorithmEvent& e) {
  json j = e.fields;
  j["step"] = e.step;
  return j;
}

Events::Events(std::string path, bool open_now, bool append) : path_(std::move(path)) {
  if (open_now && !path_.empty()) writer_ = MetricsWriter(path_, append);
}

void Events::on_view(int rank) {
  if (rank == 0 && !writer_.enabled() && !path_.empty()) writer_ = MetricsWriter(path_, /*append=*/true);
}

}  // namespace sinew::train
