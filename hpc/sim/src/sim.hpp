// sinew-sim: a SimGrid (S4U) model of Sinew's data-parallel step and of its recovery paths, for
// 4 to 16 384 ranks (docs/scale.md). Every rank is a SimGrid actor on its own host of a fat-tree cluster;
// every message of a collective, a heartbeat, an agreement or a file read is a simulated transfer that
// shares the links it crosses with the others. What the network does not decide (the time of a step's
// computation, the software cost of a ULFM call on one rank, the start of a process) comes from
// measurements on the calibration machine (calibration.json, fitted by fit()).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sinew/train/config.hpp"

namespace sinew::sim {

/// A cluster (platforms/*.json): a fat tree of switches of `radix` ports, one rank per host (a GPU with
/// its own NIC, as on nodes with one NIC per GPU), a parallel filesystem on servers of the same fabric,
/// and the runtime's (PRRTE's) daemon tree.
struct Platform {
  std::string name, description;
  double link_Bps = 0;        ///< every link, NIC and switch alike (bytes/s, each direction)
  double link_latency_s = 0;  ///< per link crossed
  double overhead_s = 0;      ///< sender's software cost per message (LogP's o)
  int radix = 0;              ///< switch ports; a switch has radix/2 ports down, radix/2 up
  double taper = 1;           ///< oversubscription of the edge switches' uplinks (1: full bisection)
  struct Pfs {
    int servers = 0;           ///< object storage servers on the fabric
    double disk_Bps = 0;       ///< one server's storage bandwidth
    int stripes = 1;           ///< servers a file is striped over
    double metadata_op_s = 0;  ///< one open at the metadata server
    int metadata_threads = 1;  ///< opens it serves at once
  } pfs;
  struct Runtime {
    int fanout = 32;            ///< PRRTE's / slurmd's launch tree
    double hop_s = 0;           ///< a daemon's cost to handle and forward a message
    double daemon_start_s = 0;  ///< starting the runtime's daemon on a node
  } runtime;
  struct Detector {
    double period_s = 0, timeout_s = 0;  ///< ULFM's heartbeat (a node's death is seen by its observer)
  } detector;
  // The calibration machine itself (platform "local"): all ranks on one host of `cores` cores, talking
  // through its memory (the loopback's latency and bandwidth).
  bool local = false;
  int cores = 1;
};

Platform load_platform(const nlohmann::json& j);

/// What a sharded job shards (Sinew's --shard, train/config.hpp): the optimiser's state (ZeRO-1), + the
/// reduced gradients (ZeRO-2), + the parameters (ZeRO-3, PyTorch models).
using train::ShardStage;

/// What is trained (the Fashion-MNIST MLP of the calibration, or a larger model stated in the sweep).
struct Workload {
  std::string name;
  double params = 0;            ///< P, float32
  double compute_s = 0;         ///< forward + backward + optimiser of one step on the calibration core
  double backward_frac = 0.6;   ///< of compute_s: backward (buckets become ready over it)
  double optimizer_frac = 0.1;  ///< of compute_s: the optimiser step after the exchange
  double bucket_bytes = 4.0 * 1024 * 1024;
  /// CPU time of a step on the calibration core beyond what the simulated messages and passes explain
  /// (an algorithm's own bookkeeping); fitted by sim.py from the 2-rank steps, per parameter.
  double overhead_s_per_param = 0;
  /// The optimiser's state buffers per parameter: 1 (SGD's momentum, the calibration's), 2 (Adam's).
  int optimizer_buffers = 1;
  /// --shard (train/shards.cpp) with this many holders per shard; 0: --shard none.
  int shard_replicas = 0;
  /// What is sharded (--shard optimizer, gradients or parameters) when shard_replicas > 0.
  ShardStage shard_stage = ShardStage::kOptimizer;
  /// --shard parameters: the model's units (a transformer's layers), gathered one at a time; taken as alike
  /// in size and holding every parameter (no root).
  int units = 8;
  /// --shard parameters: units gathered ahead (--shard-prefetch, Sinew's default 1): handed to the
  /// communication actor while a unit runs, waited for when they run.
  int prefetch = 1;
  /// A reshard's local work per byte of optimiser state (ZeRO-3: and parameters) a member holds afterwards
  /// (fresh buffers, the copies of what it kept); stated by sim.py from hpc/bench/results/.
  double reshard_s_per_byte = 0;
  /// Sinew's plan_reshard on one member at this size (measured, hpc/sim/plan_reshard_time.json).
  double plan_s = 0;
  /// The state a member holds whole: the parameters and the optimiser's buffers.
  double state_bytes() const { return 4.0 * (1 + optimizer_buffers) * params; }
  [[nodiscard]] bool sharded() const { return shard_replicas > 0; }
  [[nodiscard]] bool gradients_sharded() const { return sharded() && shard_stage != ShardStage::kOptimizer; }
  [[nodiscard]] bool parameters_sharded() const {
    return sharded() && shard_stage == ShardStage::kParameters;
  }
};

/// What one rank spends in software during an in-place recovery, outside the network (fitted per mode:
/// a spare's pool and a spawn's grown group have calls of their own cost).
struct InPlaceCosts {
  double notice_s = 0;      ///< a killed process: its node's runtime notices and tells its ranks
  double revoke_s = 0;      ///< MPIX_Comm_revoke on one rank
  double agree_hop_s = 0;   ///< ERA agreement: one rank's handling of a message of the tree
  double shrink_s = 0;      ///< MPIX_Comm_shrink on one rank beyond its two agreements and allgather
  double rebuild_s = 0;     ///< backends, buckets, checkpoint writer of the new group
  double sync_s = 0;        ///< state sync beyond its agreement and broadcast (packing, unpacking)
  double other_s = 0;       ///< the rest of a recovery outside the named calls, before the first step
  double first_step_s = 0;  ///< the first step's extra time over a steady one (caches, buffers, warm-up)
};

/// Software costs measured on the calibration machine (fit() from calibration.json): what one rank or
/// one node spends outside the network. Network and filesystem transfers are simulated, not in here.
struct Costs {
  double reduce_Bps = 0;                  ///< summing float buffers (ring/tree reduction)
  double encode_Bps = 0, decode_Bps = 0;  ///< 8-bit quantiser, bytes of floats per second
  InPlaceCosts in_place, spare, spawn;    ///< by recovery mode
  // growth by spawn
  double spawn_s = 0;         ///< MPI_Comm_spawn of one process on a node whose daemon runs
  double merge_s = 0;         ///< intercommunicator merge beyond its agreement
  double grow_rebuild_s = 0;  ///< the newcomer's set-up besides reading the data set
  // restart
  double exit_s = 0;        ///< a failed job's tear-down until the supervisor sees it exit
  double launch_s = 0;      ///< a job's start besides its processes (mpirun, sinew-supervise, set-up)
  double proc_start_s = 0;  ///< one process's start and MPI_Init (a node's daemon starts its own in turn)
  double data_s = 0;        ///< loading the data set (per rank, from the page cache of the calibration)
  double dataset_bytes = 0;
  double ckpt_load_s = 0;  ///< reading and checking a checkpoint (from the page cache)
  double ckpt_bytes = 0;
  double restart_first_step_s = 0;  ///< the restarted job's first step's extra time over a steady one
  int replay_steps = 0;             ///< steps since the last checkpoint when the rank died (the benchmark's)
};

/// The calibration: the workload measured, the costs fitted from it, and the loopback of "local".
struct Calibration {  // NOLINT(bugprone-exception-escape): json's default constructor allocates nothing
  Workload workload;
  Costs costs;
  Platform local;
  nlohmann::json fitted;  ///< every fitted figure with how it was obtained (printed by `sinew-sim fit`)
};

/// Fits the model's parameters from calibrate.py's measurements (see the formulas in fit.cpp).
Calibration fit(const nlohmann::json& measured, int fit_ranks);

// --- scenarios (each runs one SimGrid simulation; one per process) ---------------------------------

enum class Algorithm : std::uint8_t { kRing, kTree, kByteGrad, kDecentralized, kLowPrecisionDecentralized };
Algorithm algorithm_from_name(const std::string& name);
std::string algorithm_name(Algorithm a);

struct StepResult {
  double step_s = 0, compute_s = 0, exposed_comm_s = 0, bytes_per_rank = 0;
  double gather_s = 0;  ///< sharded: the parameters' gathers (after the update; ZeRO-3: of the units)
  /// --shard gradients, parameters: the communication actor's time in the gradients' reduce-scatters and
  /// the replicas' parts (overlapped with backward or not)
  double scatter_s = 0;
  bool sampled = false;  ///< long uniform loops simulated in part and extrapolated (sample > 0)
};

enum class Mode : std::uint8_t { kInPlace, kSpare, kSpawn, kRestart };
enum class Failure : std::uint8_t { kProcess, kNode };
Mode mode_from_name(const std::string& name);
std::string mode_name(Mode m);
Failure failure_from_name(const std::string& name);

struct RecoveryResult {
  std::vector<std::pair<std::string, double>> parts_s;  ///< in the order they happen
  double total_s = 0;
  int ranks_after = 0;
  double moved_state_bytes = 0;  ///< sharded: state (ZeRO-3: and parameters) sent between members
  int moved_state_messages = 0;
  double broadcast_bytes = 0;  ///< sharded, ZeRO-1 and 2: the old shards' parameters broadcast (the model)
};

struct Options {
  /// How much of a uniform pattern is simulated (0: all of it): a ring's first max(4, sample/2) steps
  /// of each phase, extrapolated at their pace; an all-to-all's n-1 shifts in `sample` messages.
  int sample = 8;
  int tree_segments = 8;
  bool simgrid_fat_tree = false;  ///< SimGrid's FatTreeZone for the fabric (quadratic to build; same routes)
  /// Simulate ULFM's agreements and the shrink's allgather as flows even when sampling, rather than
  /// compute them from the routes (computed_control() in cluster.hpp; for sim.py check).
  bool simulate_control = false;
};

/// The steps of each phase a sampled ring simulates (Options::sample > 0).
inline int ring_sample_steps(int sample) { return sample < 8 ? 4 : sample / 2; }

/// Runs one simulation (argc/argv carry SimGrid's own --cfg options).
StepResult simulate_step(int& argc, char** argv, const Platform& p, const Calibration& c, const Workload& w,
                         Algorithm a, int ranks, const Options& o);
RecoveryResult simulate_recovery(int& argc, char** argv, const Platform& p, const Calibration& c,
                                 const Workload& w, Mode m, Failure f, int ranks, const Options& o);

}  // namespace sinew::sim
