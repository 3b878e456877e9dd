#include "sinew/train/layer_options.hpp"

#include <algorithm>
#include <chrono>

namespace sinew::train {

data::DatasetOptions dataset_options(const Config& c) {
  data::DatasetOptions o;
  o.name = c.dataset;
  o.data_dir = c.data_dir;
  o.seed = c.seed;
  o.limit_train = c.limit_train;
  o.limit_test = c.limit_test;
  return o;
}

optim::OptimizerOptions optimizer_options(const Config& c) {
  return {c.optimizer, c.momentum, c.weight_decay, c.nesterov};
}

workload::ModelSpec model_spec(const Config& c) {
  return {c.model, optimizer_options(c), c.device, c.seed, c.shard != ShardStage::kNone};
}

algo::AlgorithmOptions algorithm_options(const Config& c) {
  algo::AlgorithmOptions o;
  o.kind = c.algorithm;
  o.allreduce = c.allreduce;
  o.chunk = c.compress_chunk;
  o.error_feedback = c.error_feedback;
  o.qadam_warmup_steps = c.qadam_warmup_steps;
  o.bits = c.bytegrad_bits;
  o.powersgd_rank = c.powersgd_rank;
  o.powersgd_warmup_steps = c.powersgd_warmup_steps;
  o.peer_selection = c.peer_selection;
  o.comm_interval = c.comm_interval;
  o.sync_interval_ms = c.sync_interval_ms;
  return o;
}

FabricSetup fabric_options(const Config& c) {
  FabricSetup s;
  s.op.timeout = std::chrono::milliseconds(c.timeout_ms);
  s.checkpoint_dir = c.checkpoint_dir;
  s.checkpoint_keep = c.checkpoint_keep;
  s.algorithm = algorithm_options(c);
  s.bucket_mb = c.bucket_mb;
  s.overlap = c.overlap;
  return s;
}

distill::DistillOptions distill_options(const Config& c) {
  distill::DistillOptions o;
  o.alpha = c.distill_alpha;
  o.temperature = c.distill_temperature;
  o.timeout = std::chrono::milliseconds(c.distill_timeout_ms);
  // A rank that waits for logits holds the others in the next collective: its wait stays well inside
  // that collective's deadline.
  o.max_wait = std::chrono::milliseconds(
      std::min(c.distill_max_wait_ms, std::max(c.distill_timeout_ms, c.timeout_ms / 2)));
  o.on_missing = c.distill_on_missing == "wait" ? distill::OnMissing::kWait : distill::OnMissing::kLabels;
  o.fetch_threads = c.distill_threads;
  return o;
}

}  // namespace sinew::train
