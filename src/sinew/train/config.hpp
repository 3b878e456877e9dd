// The training configuration: every option of sinew-train, with its default. The same keys are accepted
// on the command line (--key value) and in a --config file (key = value).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sinew::train {

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
  // optimiser
  std::string optimizer = "sgd";  ///< sgd | adam
  float lr = 0.05f;
  float momentum = 0.9f;
  float weight_decay = 0.f;
  bool nesterov = false;
  std::string lr_schedule = "cosine";  ///< constant | step | cosine
  std::int64_t warmup_steps = 50;
  std::int64_t lr_step_size = 1000;
  float lr_gamma = 0.1f;
  // communication
  std::string algorithm = "gradient_allreduce";  ///< docs/algorithms.md (algo::algorithm_names())
  std::string allreduce = "mpi";                 ///< gradient_allreduce: mpi | ring
  std::size_t compress_chunk = 2048;             ///< elements per 8-bit quantisation chunk
  bool error_feedback = false;                   ///< bytegrad: carry the quantisation residual
  std::int64_t qadam_warmup_steps = 100;         ///< qadam: exact Adam steps before freezing the variance
  std::string peer_selection = "all";            ///< decentralized: all | shift_one
  int comm_interval = 1;                         ///< decentralized algorithms: average every N steps
  int sync_interval_ms = 50;                     ///< async: background averaging period
  double bucket_mb = 4.0;
  bool overlap = true;
  int timeout_ms = 300000;  ///< deadline of every collective
  // checkpoints
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;
  int checkpoint_keep = 3;
  bool checkpoint_async = false;  ///< write periodic checkpoints on a background thread
  std::string resume = "auto";    ///< auto | never | PATH
  /// Test seam: "RANK:PHASE:STEP" kills RANK at PHASE (checkpoint::parse_phase) of the checkpoint of STEP.
  std::string inject_checkpoint_fault;
  // elasticity (docs/fault-tolerance.md)
  std::string elastic = "inplace";  ///< off | inplace | restart
  int min_ranks = 1;                ///< below this many ranks: checkpoint and stop (exit code 75)
  int max_ranks = 0;                ///< size to grow back to by spawning (0: the launch size)
  bool grow = true;                 ///< spawn replacements after a failure, up to max_ranks
  std::string lr_scaling = "none";  ///< none | linear | sqrt: lr follows the global batch on every resize
  std::int64_t rescale_ramp_steps = 20;  ///< after growth the lr ramps to its new value over this many steps
  std::size_t global_batch = 0;  ///< keep this global batch on every size by gradient accumulation (0: off)
  std::string resize_schedule;   ///< job-server schedule "STEP:SIZE,...": leave to shrink, spawn to grow
  /// Test seam: "RANK:PHASE:STEP" kills launch rank RANK (SIGKILL) at PHASE of step STEP (repeatable).
  std::vector<std::string> inject_fault;
  std::string audit_dir;  ///< record every sample each rank trains on (exactly-once audit)
  int step_sleep_ms = 0;  ///< testing: sleep after each step, so that signals from outside land mid-run
  // run
  std::string device = "cpu";
  std::uint64_t seed = 42;
  std::string metrics;   ///< JSON Lines file written by rank 0 (empty: none)
  int log_every = 20;    ///< steps between metrics lines
  bool progress = true;  ///< rank-0 progress line on stderr
  std::string log_level = "info";
};

/// Named points of a training step where --inject-fault kills a rank.
enum class FaultPhase : std::uint8_t {
  kForward,
  kBackward,
  kAllreduce,
  kOptimizer,
  kCheckpointWrite,
  kRecovery,
  kSpawn
};
const char* phase_name(FaultPhase p) noexcept;

struct Fault {
  int rank = -1;  ///< launch rank (MPI_COMM_WORLD at start); spawned ranks have none
  FaultPhase phase = FaultPhase::kForward;
  std::int64_t step = 0;  ///< 1-based step number
};
/// Parses RANK:PHASE:STEP; throws InvalidArgument naming --inject-fault.
Fault parse_fault(const std::string& spec);

/// Parses "STEP:SIZE,..." (steps increasing); throws InvalidArgument naming --resize-schedule.
std::vector<std::pair<std::int64_t, int>> parse_resize_schedule(const std::string& spec);

/// Outcome of command-line parsing.
struct ParseResult {
  std::optional<Config> config;  ///< empty when the run should stop (help/version printed)
  std::string text;              ///< what to print (help, version)
};

/// Parses argv (and --config FILE). Throws InvalidArgument with a one-line message naming the option for
/// unknown or malformed options and bad values (exit code 2).
ParseResult parse_command_line(int argc, const char* const* argv);

/// The configuration as JSON (stored in checkpoints; the keys are the long options with '_').
nlohmann::json to_json(const Config& c);

/// Checks values and combinations; throws InvalidArgument naming the option.
void validate(const Config& c);

}  // namespace sinew::train
