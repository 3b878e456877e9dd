// The metrics schema: every line sinew-train writes to --metrics, as a typed event. This file and
// events.cpp are its one home (docs/usage.md documents it field by field); nothing else in the train
// layer builds metrics JSON.
//
// Lines are JSON objects written by rank 0 of the current view (after rank 0 dies, its successor appends);
// every line also gets "time" (seconds since the writer opened) and "unix_time" (metrics.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sinew/train/metrics.hpp"
#include "sinew/train/summary.hpp"

namespace sinew::train {

/// First line of a run (not written by a relaunch's or a replacement's first view).
struct StartEvent {
  int world_size = 0;
  std::string model, dataset;
  std::size_t params = 0, batch_size = 0, global_batch = 0;
  std::int64_t steps = 0;
  std::size_t buckets = 0;
  int spares = 0;  ///< idle hot spares (--spares)
  std::string elastic, mpi;
  bool ulfm = false;
};

/// One logged step: means over the steps since the previous line.
struct StepEvent {
  std::int64_t step = 0, epoch = 0;
  int world_size = 0;
  double loss = 0, lr = 0, samples_per_s = 0, step_ms = 0, comm_ms = 0, exposed_comm_ms = 0;
  double bytes_sent_per_step = 0;
  // Distillation only (written when `distilling`): a step's mean wait for teacher logits (ms, mean over
  // the ranks) and the window's samples trained on labels alone (all ranks).
  bool distilling = false;
  double distill_wait_ms = 0;
  std::int64_t distill_missing = 0;
};

struct EvalEvent {
  std::int64_t epoch = 0, step = 0;
  int world_size = 0;
  double test_accuracy = 0, test_loss = 0;
};

/// A checkpoint committed (error empty) or failed (error set; the previous ones stay valid).
struct CheckpointEvent {
  std::int64_t step = 0;
  std::string reason;  ///< periodic | end | signal | min-ranks
  std::string path;
  std::uint64_t bytes = 0;
  double write_ms = 0, commit_ms = 0;
  int world_size = 0;
  std::string error;
};

struct ResumeEvent {
  std::string path;
  std::int64_t step = 0, epoch = 0;
  std::uint64_t cursor = 0;
  int from_world_size = 0, world_size = 0;
  double load_ms = 0;
  int generation = 0;
  nlohmann::json skipped = nlohmann::json::array();  ///< [{path, reason}] of newer, invalid checkpoints
  std::int64_t steps_lost = 0;  ///< steps of the newest skipped committed checkpoint past the one loaded
  double waited_s = 0;          ///< time spent waiting for missing files (--resume-wait)
};

/// Members died; written once the group recovered in place (timings of every phase).
struct FailureEvent {
  std::int64_t step = 0;  ///< the last completed step when the failure was seen
  std::string error;
  int from_world_size = 0, world_size = 0, lost = 0, attempts = 0;
  int promoted = 0;  ///< hot spares that replaced lost members (--spares); the rest were spawned
  double detected_unix_time = 0;
  std::uint64_t membership_epoch = 0;
  double revoke_ms = 0, shrink_ms = 0, agree_ms = 0, spawn_ms = 0, rebuild_ms = 0, sync_ms = 0;
  /// --shard optimizer: the part of sync_ms that rebuilt the lost shards and resharded them
  /// (train/shards.hpp); written only then (< 0: unsharded).
  double reshard_ms = -1;
  /// Of the reshard: the bytes of optimiser state this member kept and moved as whole pages into its new
  /// buffers instead of copying them (ShardedOptimizer::last_moved_bytes).
  std::size_t reshard_moved_bytes = 0;
  /// --device cuda (`on_device`): aborting the old NCCL communicator (before the shrink) and creating the
  /// new one (part of rebuild_ms); written only then.
  bool on_device = false;
  double nccl_abort_ms = 0, nccl_init_ms = 0;
  std::int64_t resumed_step = 0;
  std::string role;
};

/// The first step after a recovery completed: the recovery is over.
struct RecoveredEvent {
  int world_size = 0;
  std::uint64_t membership_epoch = 0;
  double first_step_ms = 0, total_ms = 0;
  std::int64_t step = 0;
};

/// The group got smaller: members failed (reason "failure") or left on request ("leave", with why and ms).
struct ShrinkEvent {
  std::string reason, why;
  std::int64_t step = 0;
  int from_world_size = 0, world_size = 0;
  std::uint64_t membership_epoch = 0;
  double ms = -1;  ///< < 0: not measured (failure: see the failure event)
};

/// The group grew (spawn), or could not (error set; world_size unchanged).
struct GrowEvent {
  std::string reason;
  std::int64_t step = 0;
  int from_world_size = 0, world_size = 0;
  std::uint64_t membership_epoch = 0;
  double spawn_ms = 0, merge_ms = 0, rebuild_ms = 0, sync_ms = 0, ms = 0;
  int promoted = 0;  ///< hot spares that became members (--spares), instead of spawned processes
  std::string error;
};

/// The learning-rate factor after a resize (--lr-scaling) and the accumulation for --global-batch.
struct RescaleEvent {
  std::string reason, lr_scaling;
  std::int64_t step = 0;
  int from_world_size = 0, world_size = 0;
  std::size_t global_batch = 0, accumulation = 1;
  double lr_factor_from = 1, lr_factor_to = 1;
  std::int64_t ramp_steps = 0;
};

/// An algorithm's own event (auto's decision): its fields as the algorithm wrote them, plus the step.
struct AlgorithmEvent {
  nlohmann::json fields;
  std::int64_t step = 0;
};

nlohmann::json to_json(const StartEvent& e);
nlohmann::json to_json(const StepEvent& e);
nlohmann::json to_json(const EvalEvent& e);
nlohmann::json to_json(const CheckpointEvent& e);
nlohmann::json to_json(const ResumeEvent& e);
nlohmann::json to_json(const FailureEvent& e);
nlohmann::json to_json(const RecoveredEvent& e);
nlohmann::json to_json(const ShrinkEvent& e);
nlohmann::json to_json(const GrowEvent& e);
nlohmann::json to_json(const RescaleEvent& e);
nlohmann::json to_json(const AlgorithmEvent& e);

/// Where events go: the metrics file, held by rank 0 of the current view.
class Events {
 public:
  /// `path` empty: no metrics. `append`: a relaunch continues the first launch's file.
  Events(std::string path, bool open_now, bool append);

  /// After every change of membership: a new rank 0 (its predecessor died) takes the file over, appending.
  void on_view(int rank);

  template <class E>
  void emit(const E& event) {
    if (writer_.enabled()) writer_.write(to_json(event));
  }

 private:
  std::string path_;
  MetricsWriter writer_;
};

}  // namespace sinew::train
