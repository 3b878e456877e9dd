#include <boost/program_options.hpp>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/launch.hpp"
#include "sinew/core/log.hpp"
#include "sinew/train/config.hpp"

#include <nlohmann/json.hpp>

namespace po = boost::program_options;

// Typed option values: Boost.Program_options finds these validate() overloads by argument-dependent
// lookup and the enum <-> name tables (core/names.hpp) do the parsing, with an error that names the option.
namespace sinew::train {
void validate(boost::any& v, const std::vector<std::string>& values, ElasticMode*, int) {
  v = parse_name(kElasticNames, po::validators::get_single_string(values), "--elastic");
}
void validate(boost::any& v, const std::vector<std::string>& values, ShardStage*, int) {
  v = parse_name(kShardNames, po::validators::get_single_string(values), "--shard");
}
void validate(boost::any& v, const std::vector<std::string>& values, LrScaling*, int) {
  v = parse_name(kLrScalingNames, po::validators::get_single_string(values), "--lr-scaling");
}
}  // namespace sinew::train
namespace sinew::algo {
void validate(boost::any& v, const std::vector<std::string>& values, AllreduceImpl*, int) {
  v = parse_name(kAllreduceNames, po::validators::get_single_string(values), "--allreduce");
}
void validate(boost::any& v, const std::vector<std::string>& values, Kind*, int) {
  v = parse_name(kAlgorithmNames, po::validators::get_single_string(values), "--algorithm");
}
}  // namespace sinew::algo
namespace sinew::fault {
void validate(boost::any& v, const std::vector<std::string>& values, Fault*, int) {
  v = parse_fault(po::validators::get_single_string(values), "--inject-fault");
}
}  // namespace sinew::fault

namespace sinew::train {

namespace {

po::options_description describe(Config& c, std::string& config_file) {
  // Boost keeps a pointer to the text: static, built once from the table.
  static const std::string fault_help =
      "testing: kill launch rank RANK at POINT (" + names_list(fault::kPointNames) +
      ") of step STEP (for checkpoint points: of the checkpoint of step STEP); repeatable";
  po::options_description general("General");
  general.add_options()("help,h", "print this help and exit")(
      "version", "print the version and build features and exit")(
      "config", po::value(&config_file)->value_name("FILE"),
      "read options from FILE (key = value, same keys as the long options)")(
      "log-level", po::value(&c.log_level)->default_value(c.log_level)->value_name("LEVEL"),
      "trace|debug|info|warn|error|off")("seed", po::value(&c.seed)->default_value(c.seed),
                                         "seed of initialisation and data order")(
      "device", po::value(&c.device)->default_value(c.device),
      "cpu | cuda (a GPU per rank, gradients reduced by NCCL; docs/gpu.md)")(
      "metrics", po::value(&c.metrics)->value_name("FILE"),
      "write metrics as JSON Lines to FILE (rank 0); %j: Slurm job id, %r: Slurm restart count, %%: %")(
      "log-every", po::value(&c.log_every)->default_value(c.log_every)->value_name("STEPS"),
      "steps between metrics lines")("progress",
                                     po::value(&c.progress)->default_value(c.progress)->value_name("BOOL"),
                                     "rank-0 progress line with throughput and ETA");
  po::options_description data("Model and data");
  data.add_options()("model", po::value(&c.model)->default_value(c.model),
                     "mlp | mlp:H1,H2,... | logreg | cnn")(
      "dataset", po::value(&c.dataset)->default_value(c.dataset), "fashion-mnist | mnist | csv | synthetic")(
      "data-dir", po::value(&c.data_dir)->value_name("DIR"),
      "where the data set lives (default: its Debian location)")(
      "limit-train", po::value(&c.limit_train)->default_value(c.limit_train)->value_name("N"),
      "use only the first N training samples (0: all)")(
      "limit-test", po::value(&c.limit_test)->default_value(c.limit_test)->value_name("N"),
      "use only the first N test samples (0: all)");
  po::options_description opt("Optimisation");
  opt.add_options()("epochs", po::value(&c.epochs)->default_value(c.epochs), "passes over the training set")(
      "max-steps", po::value(&c.max_steps)->default_value(c.max_steps),
      "stop after this many steps (0: no limit)")(
      "batch-size", po::value(&c.batch_size)->default_value(c.batch_size), "samples per rank per step")(
      "shuffle", po::value(&c.shuffle)->default_value(c.shuffle)->value_name("BOOL"),
      "a new random order of the training samples every epoch; false keeps the data set's order")(
      "optimizer", po::value(&c.optimizer)->default_value(c.optimizer), "sgd | adam")(
      "lr", po::value(&c.lr)->default_value(c.lr), "base learning rate")(
      "momentum", po::value(&c.momentum)->default_value(c.momentum), "SGD momentum")(
      "weight-decay", po::value(&c.weight_decay)->default_value(c.weight_decay), "L2 weight decay")(
      "nesterov", po::value(&c.nesterov)->default_value(c.nesterov)->value_name("BOOL"), "Nesterov momentum")(
      "lr-schedule", po::value(&c.lr_schedule)->default_value(c.lr_schedule), "constant | step | cosine")(
      "warmup-steps", po::value(&c.warmup_steps)->default_value(c.warmup_steps), "linear warm-up steps")(
      "lr-step-size", po::value(&c.lr_step_size)->default_value(c.lr_step_size),
      "steps between decays (step schedule)")("lr-gamma", po::value(&c.lr_gamma)->default_value(c.lr_gamma),
                                              "decay factor (step schedule)")(
      "shard",
      po::value(&c.shard)
          ->default_value(c.shard, std::string(name_of(kShardNames, c.shard)))
          ->value_name("STAGE"),
      "none: every rank holds the whole optimiser state | optimizer: each rank holds its shards of it "
      "(ZeRO-1), each shard on --shard-replicas ranks, so that a failed rank's shard is rebuilt from memory "
      "| "
      "gradients: and the gradients are reduce-scattered to the shards' holders instead of allreduced "
      "(ZeRO-2) "
      "(docs/sharding.md)")("shard-replicas",
                            po::value(&c.shard_replicas)->default_value(c.shard_replicas)->value_name("R"),
                            "--shard optimizer|gradients: ranks holding each shard's state (1: no "
                            "redundancy, a failure means a relaunch "
                            "from the newest checkpoint)")(
      "shard-prefetch", po::value(&c.shard_prefetch)->default_value(c.shard_prefetch)->value_name("UNITS"),
      "--shard parameters: units whose gather starts while the one before them runs, in forward and in "
      "backward (0: each unit gathered when it runs; each unit ahead holds its parameters whole meanwhile)");
  // The algorithms' list, from the one table (algo::kAlgorithms).
  static const std::string algorithm_help = [] {
    std::string h = "one of (docs/algorithms.md):";
    for (const auto& a : algo::kAlgorithms) {
      h += fmt::format("\n{}: {}", name_of(algo::kAlgorithmNames, a.kind), a.summary);
      if (a.device != algo::DeviceReduction::kNone) h += " [also --device cuda]";
    }
    return h;
  }();
  po::options_description comm("Communication");
  comm.add_options()(
      "algorithm",
      po::value(&c.algorithm)
          ->default_value(c.algorithm, std::string(name_of(algo::kAlgorithmNames, c.algorithm))),
      algorithm_help.c_str())(
      "allreduce",
      po::value(&c.allreduce)
          ->default_value(c.allreduce, std::string(name_of(algo::kAllreduceNames, c.allreduce))),
      "gradient_allreduce's implementation: mpi (the library's) | ring (Sinew's, over point-to-point)")(
      "compress-chunk", po::value(&c.compress_chunk)->default_value(c.compress_chunk)->value_name("N"),
      "elements per min-max quantisation chunk (bytegrad, qadam, low_precision_decentralized)")(
      "error-feedback", po::value(&c.error_feedback)->default_value(c.error_feedback)->value_name("BOOL"),
      "bytegrad: add each step's quantisation error to the next step's gradients")(
      "bytegrad-bits", po::value(&c.bytegrad_bits)->default_value(c.bytegrad_bits)->value_name("BITS"),
      "bytegrad: bits per quantised element, 8 | 4 | 2 (4 and 2 want --error-feedback true)")(
      "powersgd-rank", po::value(&c.powersgd_rank)->default_value(c.powersgd_rank)->value_name("R"),
      "powersgd: rank of each gradient matrix's approximation")(
      "powersgd-warmup-steps",
      po::value(&c.powersgd_warmup_steps)->default_value(c.powersgd_warmup_steps)->value_name("STEPS"),
      "powersgd: steps with the exact allreduce before the gradients are compressed")(
      "qadam-warmup-steps", po::value(&c.qadam_warmup_steps)->default_value(c.qadam_warmup_steps),
      "qadam: exact Adam steps before the variance is frozen and momenta are exchanged compressed")(
      "peer-selection", po::value(&c.peer_selection)->default_value(c.peer_selection),
      "decentralized: all (average with every rank) | shift_one (one peer per round, changing)")(
      "comm-interval", po::value(&c.comm_interval)->default_value(c.comm_interval)->value_name("STEPS"),
      "decentralized, low_precision_decentralized: average models every N steps")(
      "sync-interval-ms", po::value(&c.sync_interval_ms)->default_value(c.sync_interval_ms),
      "async: average models in the background this often")(
      "bucket-mb", po::value(&c.bucket_mb)->default_value(c.bucket_mb), "gradient bucket size in MiB")(
      "overlap", po::value(&c.overlap)->default_value(c.overlap)->value_name("BOOL"),
      "reduce buckets on a communication thread during backward")(
      "find-unused-parameters",
      po::value(&c.find_unused_parameters)->default_value(c.find_unused_parameters)->value_name("BOOL"),
      "reduce the gradients of parameters that got none in a step as zeros (DDP's find_unused_parameters); "
      "without it such a step fails naming them")(
      "timeout-ms", po::value(&c.timeout_ms)->default_value(c.timeout_ms), "deadline of every collective")(
      "spawn-timeout-ms", po::value(&c.spawn_timeout_ms)->default_value(c.spawn_timeout_ms),
      "deadline of a spawn that grows the group; past it the group goes on at its size")(
      "stall-timeout-ms", po::value(&c.stall_timeout_ms)->default_value(c.stall_timeout_ms),
      "a process that sends no heartbeat for this long (stopped, hung, cut off) is fenced: the runtime "
      "kills it and the others recover without it (0: off)");
  po::options_description ck("Checkpoints");
  ck.add_options()("checkpoint-dir", po::value(&c.checkpoint_dir)->value_name("DIR"),
                   "write HDF5 checkpoints here (docs/checkpoint-format.md); %j: Slurm job id (the same "
                   "after a requeue), %r: Slurm restart count, %%: %")(
      "checkpoint-every",
      po::value(&c.checkpoint_every)->default_value(c.checkpoint_every)->value_name("STEPS"),
      "checkpoint every N steps (0: only at the end and on SIGUSR1/SIGTERM)")(
      "checkpoint-keep", po::value(&c.checkpoint_keep)->default_value(c.checkpoint_keep)->value_name("K"),
      "keep the newest K checkpoints (0: all)")(
      "checkpoint-async",
      po::value(&c.checkpoint_async)->default_value(c.checkpoint_async)->value_name("BOOL"),
      "write periodic checkpoints in the background (snapshot in memory; errors surface at the next step)")(
      "resume", po::value(&c.resume)->default_value(c.resume)->value_name("auto|never|PATH"),
      "auto: newest valid checkpoint in --checkpoint-dir; never; or a checkpoint directory (%j, %r as in "
      "--checkpoint-dir)")(
      "state-mirror", po::value(&c.state_mirror)->value_name("DIR"),
      "keep the newest state after every step in DIR/state-HOST.bin, one copy per node (a tmpfs such as "
      "/dev/shm: "
      "it outlives the processes), so that --resume auto after a failure goes on at the failed step "
      "(docs/fault-tolerance.md); %j, %r as in --checkpoint-dir")(
      "resume-wait", po::value(&c.resume_wait_s)->default_value(c.resume_wait_s)->value_name("SECONDS"),
      "--resume auto: how long to wait for files of a newer committed checkpoint that are missing (a "
      "storage server down) before falling back to an older one, saying how many steps are lost");
  po::options_description el("Elasticity (docs/fault-tolerance.md)");
  el.add_options()("elastic",
                   po::value(&c.elastic)
                       ->default_value(c.elastic, std::string(name_of(kElasticNames, c.elastic)))
                       ->value_name("MODE"),
                   "inplace: survive failures without restarting (ULFM; otherwise as restart) | restart: "
                   "exit 75 on a failure for mpi_scripts/sinew-supervise to relaunch | off")(
      "min-ranks", po::value(&c.min_ranks)->default_value(c.min_ranks),
      "below this many ranks, checkpoint and stop with exit code 75")(
      "max-ranks", po::value(&c.max_ranks)->default_value(c.max_ranks),
      "grow back to this many ranks by spawning (0: the launch size)")(
      "grow", po::value(&c.grow)->default_value(c.grow)->value_name("BOOL"),
      "spawn replacements for failed ranks, up to --max-ranks")(
      "spares", po::value(&c.spares)->default_value(c.spares)->value_name("N"),
      "hot spares: the last N processes of the launch (mpirun -n RANKS+N) load the data and wait; a "
      "failed rank is replaced by one of them (spawning once none is left)")(
      "lr-scaling",
      po::value(&c.lr_scaling)
          ->default_value(c.lr_scaling, std::string(name_of(kLrScalingNames, c.lr_scaling)))
          ->value_name("MODE"),
      "none | linear | sqrt: scale the lr with the global batch on every resize")(
      "rescale-ramp-steps", po::value(&c.rescale_ramp_steps)->default_value(c.rescale_ramp_steps),
      "steps over which the lr ramps up to its new value after growth")(
      "global-batch", po::value(&c.global_batch)->default_value(c.global_batch)->value_name("N"),
      "keep N samples per step at every world size by gradient accumulation (0: batch-size x ranks)")(
      "resize-schedule", po::value(&c.resize_schedule)->value_name("STEP:SIZE,..."),
      "job server: change the group's size at these steps (ranks leave to shrink, spawn to grow)")(
      "inject-fault", po::value(&c.inject_fault)->composing()->value_name("RANK:POINT:STEP"),
      fault_help.c_str())("audit-dir", po::value(&c.audit_dir)->value_name("DIR"),
                          "record the samples every rank trains on, for mpi_scripts/check-audit.py (%j, %r "
                          "as in --checkpoint-dir)")(
      "step-sleep-ms", po::value(&c.step_sleep_ms)->default_value(c.step_sleep_ms),
      "testing: sleep this long after every step, so that a kill from outside lands mid-run");
  po::options_description ds("Distillation (docs/distillation.md): one teacher source");
  ds.add_options()("distill-registry", po::value(&c.distill_registry)->value_name("URL"),
                   "teacher service: the etcd endpoint where teachers register (http://host:port)")(
      "distill-job", po::value(&c.distill_job)->default_value(c.distill_job)->value_name("NAME"),
      "teacher service: the job whose teachers to use (the registry prefix /sinew/NAME/)")(
      "distill-token-file", po::value(&c.distill_token_file)->value_name("FILE"),
      "teacher service: the job token (default: $SINEW_JOB_TOKEN)")(
      "distill-teacher-checkpoint", po::value(&c.distill_teacher_checkpoint)->value_name("PATH"),
      "a teacher computed inside this process, from this checkpoint (or checkpoint root: its newest)")(
      "distill-table", po::value(&c.distill_table)->value_name("FILE"),
      "teacher logits precomputed by `sinew-teacher precompute`")(
      "distill-alpha", po::value(&c.distill_alpha)->default_value(c.distill_alpha),
      "loss = alpha * CE(labels) + (1 - alpha) * T^2 * KL(teacher || student)")(
      "distill-temperature", po::value(&c.distill_temperature)->default_value(c.distill_temperature),
      "T: softens teacher and student distributions in the KL term")(
      "distill-timeout-ms", po::value(&c.distill_timeout_ms)->default_value(c.distill_timeout_ms),
      "deadline of one teacher request; how long a step waits for logits under --distill-on-missing labels")(
      "distill-on-missing", po::value(&c.distill_on_missing)->default_value(c.distill_on_missing),
      "labels: samples whose logits are late train on their labels alone (logged per step) | wait: keep "
      "waiting and asking, up to --distill-max-wait-ms")(
      "distill-max-wait-ms", po::value(&c.distill_max_wait_ms)->default_value(c.distill_max_wait_ms),
      "--distill-on-missing wait: the longest a step waits before it trains on the labels (at most half of "
      "--timeout-ms: the other ranks wait for this one in the next collective)")(
      "distill-prefetch",
      po::value(&c.distill_prefetch)->default_value(c.distill_prefetch)->value_name("STEPS"),
      "ask for the logits of this many steps ahead")(
      "distill-threads", po::value(&c.distill_threads)->default_value(c.distill_threads),
      "teacher requests in flight at once");
  po::options_description all(
      "sinew-train: elastic data-parallel training over MPI\n\n"
      "usage: mpirun -n N sinew-train [options]\n");
  all.add(general).add(data).add(opt).add(comm).add(ck).add(el).add(ds);
  return all;
}

/// Boost's messages name the option but not always the value; make one line that does.
[[noreturn]] void rethrow_po(const po::error& e) {
  SINEW_THROW(InvalidArgument, "{}; see sinew-train --help", e.what());
}

/// --device cuda: what runs on the GPU (docs/gpu.md). Everything else is refused here, so that nothing
/// silently runs on the host.
void validate_cuda(const Config& c) {
  if (SINEW_HAVE_CUDA == 0) {
    SINEW_THROW(InvalidArgument,
                "--device cuda: this build of Sinew has no GPU support (CMake found no CUDA toolkit or "
                "nccl.h); rebuild with them (docs/gpu.md) or use --device cpu");
  }
  if (c.model.rfind("cnn", 0) == 0) {
    SINEW_THROW(InvalidArgument,
                "--device cuda supports the models logreg and mlp[:H1,...]; --model {} runs on --device cpu "
                "only",
                c.model);
  }
  if (algo::info(c.algorithm).device == algo::DeviceReduction::kNone) {
    std::string on_gpu;
    for (const auto& a : algo::kAlgorithms)
      if (a.device != algo::DeviceReduction::kNone)
        on_gpu += (on_gpu.empty() ? "" : " or ") + std::string(name_of(algo::kAlgorithmNames, a.kind));
    SINEW_THROW(InvalidArgument, "--algorithm {} runs on the CPU only; with --device cuda use {}",
                name_of(algo::kAlgorithmNames, c.algorithm), on_gpu);
  }
  if (c.algorithm == algo::Kind::kGradientAllreduce && c.allreduce != algo::AllreduceImpl::kMpi) {
    SINEW_THROW(InvalidArgument,
                "--allreduce {} runs on the CPU only; with --device cuda gradients are reduced by NCCL "
                "(leave --allreduce at its default)",
                name_of(algo::kAllreduceNames, c.allreduce));
  }
  if (c.error_feedback) {
    SINEW_THROW(InvalidArgument,
                "--error-feedback runs on the CPU only; with --device cuda bytegrad runs without it");
  }
  if (c.bytegrad_bits != 8) {
    SINEW_THROW(InvalidArgument,
                "--bytegrad-bits {} runs on the CPU only; with --device cuda bytegrad sends 8 bits",
                c.bytegrad_bits);
  }
}

void one_of(const std::string& value, std::initializer_list<const char*> allowed, const char* option) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += list.empty() ? a : std::string(", ") + a;
  }
  SINEW_THROW(InvalidArgument, "{}: unknown value '{}'; use one of {}", option, value, list);
}

}  // namespace

std::vector<std::pair<std::int64_t, int>> parse_resize_schedule(const std::string& spec) {
  std::vector<std::pair<std::int64_t, int>> out;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto colon = item.find(':');
    std::int64_t step = -1;
    int size = 0;
    try {
      if (colon == std::string::npos) throw std::invalid_argument(item);
      std::size_t u1 = 0, u2 = 0;
      step = std::stoll(item.substr(0, colon), &u1);
      size = std::stoi(item.substr(colon + 1), &u2);
      if (u1 != colon || u2 != item.size() - colon - 1) throw std::invalid_argument(item);
    } catch (const std::logic_error&) {
      step = -1;
    }
    if (step < 1 || size < 1 || (!out.empty() && step <= out.back().first)) {
      SINEW_THROW(InvalidArgument,
                  "--resize-schedule: '{}' is not STEP:SIZE (STEP >= 1 and increasing, SIZE >= 1) in '{}'",
                  item, spec);
    }
    out.emplace_back(step, size);
  }
  return out;
}

void expand_path_patterns(Config& c, const launch::Launch& env) {
  c.checkpoint_dir = launch::expand_path(c.checkpoint_dir, "--checkpoint-dir", env);
  c.metrics = launch::expand_path(c.metrics, "--metrics", env);
  c.audit_dir = launch::expand_path(c.audit_dir, "--audit-dir", env);
  c.resume = launch::expand_path(c.resume, "--resume", env);
  c.state_mirror = launch::expand_path(c.state_mirror, "--state-mirror", env);
}

namespace {
void validate_distill(const Config& c) {
  const int sources = static_cast<int>(!c.distill_registry.empty()) +
                      static_cast<int>(!c.distill_teacher_checkpoint.empty()) +
                      static_cast<int>(!c.distill_table.empty());
  if (sources > 1) {
    SINEW_THROW(
        InvalidArgument,
        "give one teacher source: --distill-registry, --distill-teacher-checkpoint or --distill-table");
  }
  if (!(c.distill_alpha >= 0.f && c.distill_alpha <= 1.f))
    SINEW_THROW(InvalidArgument, "--distill-alpha must be in [0, 1], got {}", c.distill_alpha);
  if (!(c.distill_temperature > 0.f && c.distill_temperature <= 100.f))
    SINEW_THROW(InvalidArgument, "--distill-temperature must be in (0, 100], got {}", c.distill_temperature);
  if (c.distill_timeout_ms < 1 || c.distill_timeout_ms > 3600000)
    SINEW_THROW(InvalidArgument, "--distill-timeout-ms must be in [1, 3600000], got {}",
                c.distill_timeout_ms);
  if (c.distill_max_wait_ms < c.distill_timeout_ms || c.distill_max_wait_ms > 3600000) {
    SINEW_THROW(InvalidArgument, "--distill-max-wait-ms must be in [--distill-timeout-ms, 3600000], got {}",
                c.distill_max_wait_ms);
  }
  one_of(c.distill_on_missing, {"labels", "wait"}, "--distill-on-missing");
  if (sources > 0 && c.device == "cuda") {
    SINEW_THROW(InvalidArgument,
                "distillation runs on the CPU only for now: drop --device cuda or the --distill-* source");
  }
  if (c.distill_prefetch < 0 || c.distill_prefetch > 1000)
    SINEW_THROW(InvalidArgument, "--distill-prefetch must be in [0, 1000], got {}", c.distill_prefetch);
  if (c.distill_threads < 1 || c.distill_threads > 64)
    SINEW_THROW(InvalidArgument, "--distill-threads must be in [1, 64], got {}", c.distill_threads);
  if (c.distill_job.empty() || c.distill_job.find_first_of("/ \t") != std::string::npos)
    SINEW_THROW(InvalidArgument, "--distill-job must be a non-empty name without '/' or spaces, got '{}'",
                c.distill_job);
}
}  // namespace

namespace {
/// --shard: what exists, and what it combines with (docs/sharding.md's table).
void validate_shard(const Config& c) {
  if (c.shard_replicas < 1 || c.shard_replicas > 64)
    SINEW_THROW(InvalidArgument, "--shard-replicas must be in [1, 64], got {}", c.shard_replicas);
  if (c.shard_prefetch < 0 || c.shard_prefetch > 8)
    SINEW_THROW(InvalidArgument, "--shard-prefetch must be in [0, 8] units, got {}", c.shard_prefetch);
  if (c.shard == ShardStage::kNone) return;
  const auto stage = name_of(kShardNames, c.shard);
  if (c.algorithm != algo::Kind::kGradientAllreduce && c.algorithm != algo::Kind::kByteGrad) {
    SINEW_THROW(InvalidArgument,
                "--shard {} combines with --algorithm gradient_allreduce or bytegrad (each rank updates its "
                "shards from the reduced gradients), not with {}: use --shard none",
                stage, name_of(algo::kAlgorithmNames, c.algorithm));
  }
  if (c.device == "cuda" && c.shard == ShardStage::kParameters) {
    SINEW_THROW(InvalidArgument,
                "--shard parameters: not on a GPU (its units are gathered and released in host memory); use "
                "--shard gradients or optimizer with --device cuda");
  }
  if (c.device == "cuda" && c.shard == ShardStage::kGradients && c.algorithm == algo::Kind::kByteGrad) {
    SINEW_THROW(InvalidArgument,
                "--shard gradients with --algorithm bytegrad: not on a GPU (its quantised reduce-scatter is "
                "the CPU's); use --shard optimizer or --algorithm gradient_allreduce with --device cuda");
  }
}
}  // namespace

void validate(const Config& c) {
  if (c.epochs < 1) SINEW_THROW(InvalidArgument, "--epochs must be >= 1, got {}", c.epochs);
  if (c.max_steps < 0) SINEW_THROW(InvalidArgument, "--max-steps must be >= 0, got {}", c.max_steps);
  if (c.batch_size < 1 || c.batch_size > (1u << 20)) {
    SINEW_THROW(InvalidArgument, "--batch-size must be between 1 and 1048576, got {}", c.batch_size);
  }
  if (!(c.lr > 0.f) || !std::isfinite(c.lr))
    SINEW_THROW(InvalidArgument, "--lr must be a positive number, got {}", c.lr);
  if (c.momentum < 0.f || c.momentum >= 1.f)
    SINEW_THROW(InvalidArgument, "--momentum must be in [0, 1), got {}", c.momentum);
  if (c.weight_decay < 0.f)
    SINEW_THROW(InvalidArgument, "--weight-decay must be >= 0, got {}", c.weight_decay);
  if (c.warmup_steps < 0) SINEW_THROW(InvalidArgument, "--warmup-steps must be >= 0, got {}", c.warmup_steps);
  if (!(c.bucket_mb > 0.0) || c.bucket_mb > 1024.0) {
    SINEW_THROW(InvalidArgument, "--bucket-mb must be in (0, 1024], got {}", c.bucket_mb);
  }
  if (c.timeout_ms < 1) SINEW_THROW(InvalidArgument, "--timeout-ms must be >= 1, got {}", c.timeout_ms);
  // The spawned processes get twice this as their own join deadline (an int of milliseconds).
  if (c.spawn_timeout_ms < 1 || c.spawn_timeout_ms > 3600000) {
    SINEW_THROW(InvalidArgument, "--spawn-timeout-ms must be in [1, 3600000], got {}", c.spawn_timeout_ms);
  }
  if (c.stall_timeout_ms != 0 && (c.stall_timeout_ms < 100 || c.stall_timeout_ms > 3600000)) {
    SINEW_THROW(InvalidArgument, "--stall-timeout-ms must be 0 (off) or in [100, 3600000], got {}",
                c.stall_timeout_ms);
  }
  if (c.log_every < 1) SINEW_THROW(InvalidArgument, "--log-every must be >= 1, got {}", c.log_every);
  one_of(c.optimizer, {"sgd", "adam"}, "--optimizer");
  validate_shard(c);
  one_of(c.lr_schedule, {"constant", "step", "cosine"}, "--lr-schedule");
  one_of(c.dataset, {"fashion-mnist", "mnist", "csv", "synthetic"}, "--dataset");
  one_of(c.peer_selection, {"all", "shift_one"}, "--peer-selection");
  if (c.compress_chunk < 1 || c.compress_chunk > (1u << 24)) {
    SINEW_THROW(InvalidArgument, "--compress-chunk must be between 1 and 16777216, got {}", c.compress_chunk);
  }
  if (c.bytegrad_bits != 8 && c.bytegrad_bits != 4 && c.bytegrad_bits != 2) {
    SINEW_THROW(InvalidArgument, "--bytegrad-bits must be 8, 4 or 2, got {}", c.bytegrad_bits);
  }
  if (c.bytegrad_bits < 8 && c.compress_chunk % static_cast<std::size_t>(8 / c.bytegrad_bits) != 0) {
    SINEW_THROW(InvalidArgument,
                "--compress-chunk {} is not a multiple of {}: at --bytegrad-bits {} every chunk must start "
                "on a byte",
                c.compress_chunk, 8 / c.bytegrad_bits, c.bytegrad_bits);
  }
  if (c.powersgd_rank < 1 || c.powersgd_rank > 1024) {
    SINEW_THROW(InvalidArgument, "--powersgd-rank must be between 1 and 1024, got {}", c.powersgd_rank);
  }
  if (c.powersgd_warmup_steps < 0) {
    SINEW_THROW(InvalidArgument, "--powersgd-warmup-steps must be >= 0, got {}", c.powersgd_warmup_steps);
  }
  if (c.qadam_warmup_steps < 1) {
    SINEW_THROW(InvalidArgument,
                "--qadam-warmup-steps must be >= 1 (Adam needs a variance to freeze), got {}",
                c.qadam_warmup_steps);
  }
  if (c.algorithm == algo::Kind::kQAdam && c.optimizer != "adam") {
    SINEW_THROW(InvalidArgument, "--algorithm qadam needs --optimizer adam (got --optimizer {})",
                c.optimizer);
  }
  if (c.comm_interval < 1)
    SINEW_THROW(InvalidArgument, "--comm-interval must be >= 1, got {}", c.comm_interval);
  if (c.sync_interval_ms < 1 || c.sync_interval_ms > 600000) {
    SINEW_THROW(InvalidArgument, "--sync-interval-ms must be in [1, 600000], got {}", c.sync_interval_ms);
  }
  if (c.min_ranks < 1) SINEW_THROW(InvalidArgument, "--min-ranks must be >= 1, got {}", c.min_ranks);
  if (c.max_ranks < 0) SINEW_THROW(InvalidArgument, "--max-ranks must be >= 0, got {}", c.max_ranks);
  if (c.max_ranks > 0 && c.max_ranks < c.min_ranks) {
    SINEW_THROW(InvalidArgument, "--max-ranks {} is below --min-ranks {}", c.max_ranks, c.min_ranks);
  }
  if (c.spares < 0 || c.spares > 4096) {
    SINEW_THROW(InvalidArgument, "--spares must be in [0, 4096], got {}", c.spares);
  }
  if (c.spares > 0 && (c.elastic != ElasticMode::kInplace || !c.grow)) {
    SINEW_THROW(InvalidArgument,
                "--spares {} replaces failed ranks in place: it needs --elastic inplace and --grow true",
                c.spares);
  }
  if (c.rescale_ramp_steps < 0) {
    SINEW_THROW(InvalidArgument, "--rescale-ramp-steps must be >= 0, got {}", c.rescale_ramp_steps);
  }
  if (c.global_batch > (1u << 30)) {
    SINEW_THROW(InvalidArgument, "--global-batch must be at most 2^30, got {}", c.global_batch);
  }
  parse_resize_schedule(c.resize_schedule);
  if (c.step_sleep_ms < 0 || c.step_sleep_ms > 60000) {
    SINEW_THROW(InvalidArgument, "--step-sleep-ms must be in [0, 60000], got {}", c.step_sleep_ms);
  }
  if (c.checkpoint_every < 0) {
    SINEW_THROW(InvalidArgument, "--checkpoint-every must be >= 0, got {}", c.checkpoint_every);
  }
  if (c.checkpoint_keep < 0)
    SINEW_THROW(InvalidArgument, "--checkpoint-keep must be >= 0, got {}", c.checkpoint_keep);
  if (c.checkpoint_every > 0 && c.checkpoint_dir.empty()) {
    SINEW_THROW(InvalidArgument, "--checkpoint-every needs --checkpoint-dir");
  }
  if (!(c.resume_wait_s >= 0 && c.resume_wait_s <= 86400))
    SINEW_THROW(InvalidArgument, "--resume-wait must be in [0, 86400] seconds, got {}", c.resume_wait_s);
  if (c.resume.empty())
    SINEW_THROW(InvalidArgument, "--resume: empty value; use auto, never or a checkpoint path");
  one_of(c.device, {"cpu", "cuda"}, "--device");
  if (c.device == "cuda") validate_cuda(c);
  validate_distill(c);
  log::parse_level(c.log_level);
}

nlohmann::json to_json(const Config& c) {
  return {{"model", c.model},
          {"dataset", c.dataset},
          {"data_dir", c.data_dir},
          {"limit_train", c.limit_train},
          {"limit_test", c.limit_test},
          {"epochs", c.epochs},
          {"max_steps", c.max_steps},
          {"batch_size", c.batch_size},
          {"shuffle", c.shuffle},
          {"optimizer", c.optimizer},
          {"lr", c.lr},
          {"momentum", c.momentum},
          {"weight_decay", c.weight_decay},
          {"nesterov", c.nesterov},
          {"lr_schedule", c.lr_schedule},
          {"shard", std::string(name_of(kShardNames, c.shard))},
          {"shard_replicas", c.shard_replicas},
          {"shard_prefetch", c.shard_prefetch},
          {"warmup_steps", c.warmup_steps},
          {"lr_step_size", c.lr_step_size},
          {"lr_gamma", c.lr_gamma},
          {"algorithm", std::string(name_of(algo::kAlgorithmNames, c.algorithm))},
          {"allreduce", std::string(name_of(algo::kAllreduceNames, c.allreduce))},
          {"compress_chunk", c.compress_chunk},
          {"error_feedback", c.error_feedback},
          {"qadam_warmup_steps", c.qadam_warmup_steps},
          {"bytegrad_bits", c.bytegrad_bits},
          {"powersgd_rank", c.powersgd_rank},
          {"powersgd_warmup_steps", c.powersgd_warmup_steps},
          {"peer_selection", c.peer_selection},
          {"comm_interval", c.comm_interval},
          {"sync_interval_ms", c.sync_interval_ms},
          {"bucket_mb", c.bucket_mb},
          {"elastic", std::string(name_of(kElasticNames, c.elastic))},
          {"lr_scaling", std::string(name_of(kLrScalingNames, c.lr_scaling))},
          {"global_batch", c.global_batch},
          {"distill_alpha", c.distill_alpha},
          {"distill_temperature", c.distill_temperature},
          {"distilled", distilling(c)},
          {"seed", c.seed}};
}

ParseResult parse_command_line(int argc, const char* const* argv) {
  return parse_command_line(argc, argv, launch::current());
}

namespace {

/// The arguments with "true" after every BOOL option given bare (`--find-unused-parameters --lr 0.1`),
/// so that a flag works as users write it and never takes the next option for its value.
std::vector<std::string> with_bare_flags(int argc, const char* const* argv,
                                         const po::options_description& desc) {
  static const std::set<std::string> literals = {"true", "false", "1", "0", "yes", "no", "on", "off"};
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    out.push_back(a);
    if (a.size() < 3 || a.rfind("--", 0) != 0 || a.find('=') != std::string::npos) continue;
    const auto* o = desc.find_nothrow(a.substr(2), /*approx=*/false);
    if (o == nullptr || o->semantic()->name().rfind("BOOL", 0) != 0) continue;
    if (i + 1 >= argc || literals.count(argv[i + 1]) == 0) out.emplace_back("true");
  }
  return out;
}

}  // namespace

ParseResult parse_command_line(int argc, const char* const* argv, const launch::Launch& env) {
  Config c;
  std::string config_file;
  auto desc = describe(c, config_file);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(with_bare_flags(argc, argv, desc)).options(desc).run(), vm);
    if (vm.count("help")) {
      std::ostringstream os;
      os << desc;
      return {std::nullopt, os.str()};
    }
    if (vm.count("version")) {
      return {std::nullopt, fmt::format("sinew-train {} (ULFM {}, CUDA {}, NCCL {})\n", SINEW_VERSION,
                                        SINEW_HAVE_ULFM ? "compiled in" : "absent",
                                        SINEW_HAVE_CUDA ? "yes" : "no", SINEW_HAVE_NCCL ? "yes" : "no")};
    }
    if (vm.count("config")) {
      const std::string file = vm["config"].as<std::string>();
      std::ifstream in(file);
      if (!in) SINEW_THROW(InvalidArgument, "--config: cannot open '{}'", file);
      // Command-line values were stored first and win over the file's.
      try {
        po::store(po::parse_config_file(in, desc), vm);
      } catch (const po::error& e) {
        SINEW_THROW(InvalidArgument, "--config {}: {}", file, e.what());
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    rethrow_po(e);
  }
  // Here, before MPI starts, from the environment every rank shares: every rank gets the same paths.
  expand_path_patterns(c, env);
  validate(c);
  // Asked for by name where it does nothing: said, not ignored.
  if (!vm["shard-prefetch"].defaulted() && c.shard != ShardStage::kParameters) {
    SINEW_THROW(
        InvalidArgument,
        "--shard-prefetch is for --shard parameters (ZeRO-3: units gathered while they run); this job "
        "has --shard {}: leave --shard-prefetch out or use --shard parameters",
        name_of(kShardNames, c.shard));
  }
  return {c, {}};
}

}  // namespace sinew::train
