// The training configuration: every option of sinew-train, with its default. The same keys are accepted
// on the command line (--key value) and in a --config file (key = value).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sinew/algo/algorithm.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/launch.hpp"
#include "sinew/core/names.hpp"

namespace sinew::train {

/// --elastic: what a failure of a member does to the run (docs/fault-tolerance.md).
enum class ElasticMode : std::uint8_t {
  kOff,      ///< the run fails (exit code 5)
  kInplace,  ///< survivors recover in place with ULFM (restart semantics without it)
  kRestart,  ///< exit 75 for mpi_scripts/sinew-supervise to relaunch from the latest checkpoint
};
inline constexpr NameTable<ElasticMode, 3> kElasticNames{
    {{ElasticMode::kOff, "off"}, {ElasticMode::kInplace, "inplace"}, {ElasticMode::kRestart, "restart"}}};

/// --shard: which part of the training state is sharded over the ranks (docs/sharding.md). The names are
/// ZeRO's stages; parameters (ZeRO-3) is refused until it exists.
enum class ShardStage : std::uint8_t { kNone, kOptimizer, kGradients, kParameters };
inline constexpr NameTable<ShardStage, 4> kShardNames{{{ShardStage::kNone, "none"},
                                                       {ShardStage::kOptimizer, "optimizer"},
                                                       {ShardStage::kGradients, "gradients"},
                                                       {ShardStage::kParameters, "parameters"}}};

/// --lr-scaling: how the learning rate follows the global batch on a resize.
enum class LrScaling : std::uint8_t { kNone, kLinear, kSqrt };
inline constexpr NameTable<LrScaling, 3> kLrScalingNames{
    {{LrScaling::kNone, "none"}, {LrScaling::kLinear, "linear"}, {LrScaling::kSqrt, "sqrt"}}};

struct Config {
  // model and data
  std::string model = "mlp";              ///< mlp | mlp:H1,H2,... | logreg | cnn
  std::string dataset = "fashion-mnist";  ///< fashion-mnist | mnist | csv | synthetic
  std::string data_dir;                   ///< empty: the dataset's default location
  std::size_t limit_train = 0;            ///< use only the first N training samples (0: all)
  std::size_t limit_test = 0;             ///< use only the first N test samples (0: all)
  // schedule
  int epochs = 3;
  std::int64_t max_steps = 0;   ///< stop after this many steps (0: run all epochs)
  std::size_t batch_size = 64;  ///< per rank
  bool shuffle = true;          ///< a new sample order every epoch (false: the data set's order)
  // optimiser
  std::string optimizer = "sgd";  ///< sgd | adam
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.f;
  bool nesterov = false;
  std::string lr_schedule = "cosine";    ///< constant | step | cosine
  ShardStage shard = ShardStage::kNone;  ///< --shard: none | optimizer (ZeRO-1) | gradients (ZeRO-2)
  int shard_replicas = 2;                ///< --shard-replicas: holders of each shard's state
  int shard_prefetch = 1;                ///< --shard-prefetch: units gathered ahead (--shard parameters)
  /// --shard parameters: the model gathered whole on every member when training ends (for what the script
  /// does with it afterwards). False where it does not fit a rank whole beside the optimiser's shards (a
  /// Python script's memory check sets it, python/sinew/memory.py): it stays sharded, its parameters in the
  /// end checkpoint. Not a command-line option.
  bool whole_at_end = true;
  std::int64_t warmup_steps = 50;
  std::int64_t lr_step_size = 1000;
  float lr_gamma = 0.1f;
  // communication
  algo::Kind algorithm = algo::Kind::kGradientAllreduce;      ///< docs/algorithms.md (algo::kAlgorithms)
  algo::AllreduceImpl allreduce = algo::AllreduceImpl::kMpi;  ///< gradient_allreduce: mpi | ring
  std::size_t compress_chunk = 2048;                          ///< elements per quantisation chunk (any width)
  bool error_feedback = false;                                ///< bytegrad: carry the quantisation residual
  int bytegrad_bits = 8;                                      ///< bytegrad: bits per element (8, 4, 2)
  int powersgd_rank = 4;                                      ///< powersgd: rank of the approximation
  std::int64_t powersgd_warmup_steps = 10;                    ///< powersgd: exact steps before compressing
  std::int64_t qadam_warmup_steps = 100;  ///< qadam: exact Adam steps before freezing the variance
  std::string peer_selection = "all";     ///< decentralized: all | shift_one
  int comm_interval = 1;                  ///< decentralized algorithms: average every N steps
  int sync_interval_ms = 50;              ///< async: background averaging period
  double bucket_mb = 4.0;
  bool overlap = true;
  bool find_unused_parameters = false;  ///< ranges no gradient was reported for are reduced as zeros
  int timeout_ms = 300000;              ///< deadline of every collective
  int spawn_timeout_ms = 30000;  ///< deadline of a spawn (growth); past it the group goes on at its size
  int stall_timeout_ms = 10000;  ///< a process silent this long (SIGSTOP, hung) is fenced; 0: off
  // checkpoints
  std::string checkpoint_dir;  ///< empty: none; path options have %j, %r expanded (expand_path_patterns)
  std::int64_t checkpoint_every = 0;
  int checkpoint_keep = 3;
  bool checkpoint_async = false;  ///< write periodic checkpoints on a background thread
  std::string resume = "auto";    ///< auto | never | PATH
  std::string state_mirror;   ///< node-local copy of the newest state (train/state_mirror.hpp); empty: none
  double resume_wait_s = 30;  ///< --resume auto: how long missing files may take to reappear
  // elasticity (docs/fault-tolerance.md)
  ElasticMode elastic = ElasticMode::kInplace;
  int min_ranks = 1;  ///< below this many ranks: checkpoint and stop (exit code 75)
  int max_ranks = 0;  ///< size to grow back to by spawning (0: the launch size)
  bool grow = true;   ///< spawn replacements after a failure, up to max_ranks
  int spares = 0;     ///< hot spares: the last N launched processes wait and replace failed ranks
  LrScaling lr_scaling = LrScaling::kNone;  ///< lr follows the global batch on every resize
  std::int64_t rescale_ramp_steps = 20;  ///< after growth the lr ramps to its new value over this many steps
  std::size_t global_batch = 0;  ///< keep this global batch on every size by gradient accumulation (0: off)
  std::string resize_schedule;   ///< job-server schedule "STEP:SIZE,...": leave to shrink, spawn to grow
  /// Test seam: --inject-fault RANK:POINT:STEP (repeatable), parsed with the options (core/fault.hpp).
  std::vector<fault::Fault> inject_fault;
  std::string audit_dir;  ///< record every sample each rank trains on (exactly-once audit)
  int step_sleep_ms = 0;  ///< testing: sleep after each step, so that signals from outside land mid-run
  // distillation (docs/distillation.md): one teacher source at most
  std::string distill_registry;            ///< etcd endpoint where teachers register (teacher service)
  std::string distill_job = "default";     ///< the job's prefix in the registry
  std::string distill_token_file;          ///< the job token (else $SINEW_JOB_TOKEN)
  std::string distill_teacher_checkpoint;  ///< a teacher computed inside this process
  std::string distill_table;               ///< a table of logits from `sinew-teacher precompute`
  float distill_alpha = 0.5f;              ///< weight of the label term
  float distill_temperature = 4.0f;
  int distill_timeout_ms = 2000;              ///< deadline of one request; a step's wait under "labels"
  int distill_max_wait_ms = 60000;            ///< a step's longest wait under "wait"
  std::string distill_on_missing = "labels";  ///< labels | wait
  int distill_prefetch = 4;                   ///< steps whose logits are asked for ahead of time
  int distill_threads = 2;                    ///< requests in flight at once
  // run
  std::string device = "cpu";
  std::uint64_t seed = 42;
  std::string metrics;   ///< JSON Lines file written by rank 0 (empty: none)
  int log_every = 20;    ///< steps between metrics lines
  bool progress = true;  ///< rank-0 progress line on stderr
  std::string log_level = "info";
};

/// Whether the run distils from a teacher (one of the --distill-* sources is given).
[[nodiscard]] inline bool distilling(const Config& c) {
  return !c.distill_registry.empty() || !c.distill_teacher_checkpoint.empty() || !c.distill_table.empty();
}

/// Parses "STEP:SIZE,..." (steps increasing); throws InvalidArgument naming --resize-schedule.
std::vector<std::pair<std::int64_t, int>> parse_resize_schedule(const std::string& spec);

/// Outcome of command-line parsing.
struct ParseResult {
  std::optional<Config> config;  ///< empty when the run should stop (help/version printed)
  std::string text;              ///< what to print (help, version)
};

/// Parses argv (and --config FILE), expands the path patterns (expand_path_patterns) with `env` and
/// validates. Throws InvalidArgument with a one-line message naming the option for unknown or malformed
/// options and bad values (exit code 2).
ParseResult parse_command_line(int argc, const char* const* argv, const launch::Launch& env);
/// The same with this process's launch environment (launch::current()).
ParseResult parse_command_line(int argc, const char* const* argv);

/// Expands %j (Slurm job id), %r (Slurm restart count) and %% in the path options --checkpoint-dir,
/// --metrics, --audit-dir and --resume (launch::expand_path; InvalidArgument naming the option).
void expand_path_patterns(Config& c, const launch::Launch& env);

/// The configuration as JSON (stored in checkpoints; the keys are the long options with '_').
nlohmann::json to_json(const Config& c);

/// Checks values and combinations; throws InvalidArgument naming the option.
void validate(const Config& c);

}  // namespace sinew::train
