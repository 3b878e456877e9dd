// Communication algorithms of data-parallel training (docs/algorithms.md): how ranks combine what they
// learn each step. The exact baseline reduces every gradient (gradient_allreduce); the relaxed ones trade
// exactness for bytes on a slow network (Bagua's ByteGrad, QAdam, decentralized and asynchronous model
// averaging, PowerSGD's low-rank gradients), and `auto` chooses among them from a bandwidth measurement.
//
// The trainer calls an algorithm at fixed points of a step:
//   begin_step()      before the step's forward pass, with the step's number (PowerSGD: warm-up or not);
//   reduce_bucket()   a gradient bucket is final (during backward, on the bucketer's communication thread)
//                     -- only if reduces_gradients() for this step;
//   step()            the optimiser step (an algorithm may take it over: QAdam);
//   after_step()      after the update (decentralized: average models with peers);
//   consensus()       before a checkpoint, an evaluation or a change of membership: make every rank's
//                     model and optimiser state the same (a no-op for exact algorithms);
//   reset()           after the trainer synchronised the state from one rank (recovery, growth).
// An algorithm is rebuilt over the new backend after every change of membership. Every collective it
// issues has a deadline, and a failed peer surfaces as CommFailure or Timeout, which the trainer turns
// into an in-place recovery; an algorithm's background thread (async) stops when the object is destroyed.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sinew/algo/collectives.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/core/names.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::algo {

/// The exact allreduce of gradient_allreduce: the backend's own (the MPI library's tuned algorithms, on
/// the bucketer's path) or Sinew's ring (comm::ring::RingBackend over the group's backend).
enum class AllreduceImpl : std::uint8_t { kMpi, kRing };
inline constexpr sinew::NameTable<AllreduceImpl, 2> kAllreduceNames{
    {{AllreduceImpl::kMpi, "mpi"}, {AllreduceImpl::kRing, "ring"}}};

/// The algorithms --algorithm names: this enumeration and kAlgorithms below are the one list of them;
/// the option's parser, its help text, the factory and validate()'s checks all read it.
enum class Kind : std::uint8_t {
  kGradientAllreduce,
  kByteGrad,
  kQAdam,
  kDecentralized,
  kLowPrecisionDecentralized,
  kAsync,
  kPowerSgd,
  kAuto,
};
inline constexpr NameTable<Kind, 8> kAlgorithmNames{
    {{Kind::kGradientAllreduce, "gradient_allreduce"},
     {Kind::kByteGrad, "bytegrad"},
     {Kind::kQAdam, "qadam"},
     {Kind::kDecentralized, "decentralized"},
     {Kind::kLowPrecisionDecentralized, "low_precision_decentralized"},
     {Kind::kAsync, "async"},
     {Kind::kPowerSgd, "powersgd"},
     {Kind::kAuto, "auto"}}};

/// How an algorithm's gradient buckets are reduced when the gradients live in device memory
/// (--device cuda): by what the algorithm declares, never by its name.
enum class DeviceReduction : std::uint8_t {
  kNone,       ///< the algorithm runs on the CPU only
  kAllreduce,  ///< NCCL's sum allreduce of each bucket
  kByteGrad,   ///< 8-bit min-max quantised exchange over NCCL (comm/nccl/bytegrad.hpp), no error feedback
};

/// What the list says of each algorithm.
struct AlgorithmInfo {
  Kind kind;
  std::string_view summary;  ///< one line for --help and the docs' table
  DeviceReduction device;    ///< its reduction on a GPU
};
inline constexpr std::array<AlgorithmInfo, 8> kAlgorithms{{
    {Kind::kGradientAllreduce, "the exact baseline: every gradient bucket summed (--allreduce mpi | ring)",
     DeviceReduction::kAllreduce},
    {Kind::kByteGrad, "gradients reduced in 8, 4 or 2-bit min-max quantised form (Bagua), error feedback",
     DeviceReduction::kByteGrad},
    {Kind::kQAdam, "exact Adam for a warm-up, then quantised momenta exchanged (Bagua; --optimizer adam)",
     DeviceReduction::kNone},
    {Kind::kDecentralized, "local steps, then models averaged with all or one peer (--peer-selection)",
     DeviceReduction::kNone},
    {Kind::kLowPrecisionDecentralized, "local steps, 8-bit model differences with ring neighbours",
     DeviceReduction::kNone},
    {Kind::kAsync, "local steps while a background thread averages the models", DeviceReduction::kNone},
    {Kind::kPowerSgd, "gradients as rank-r low-rank factors with error feedback (Vogels et al.)",
     DeviceReduction::kNone},
    {Kind::kAuto, "measures the bandwidth and picks gradient_allreduce, bytegrad or powersgd",
     DeviceReduction::kNone},
}};
/// The list's entry of `kind`.
[[nodiscard]] constexpr const AlgorithmInfo& info(Kind kind) {
  for (const auto& a : kAlgorithms)
    if (a.kind == kind) return a;
  return kAlgorithms[0];  // unreachable: every Kind has an entry (static_assert below)
}
static_assert([] {
  for (const auto& [kind, name] : kAlgorithmNames)
    if (info(kind).kind != kind) return false;
  return kAlgorithms.size() == kAlgorithmNames.size();
}());

struct AlgorithmOptions {
  Kind kind = Kind::kGradientAllreduce;
  AllreduceImpl allreduce = AllreduceImpl::kMpi;  ///< gradient_allreduce's exact allreduce
  std::size_t chunk = 2048;                       ///< elements per quantisation chunk (bytegrad, qadam, lpd)
  bool error_feedback = false;            ///< bytegrad: carry the quantisation residual to the next step
  std::int64_t qadam_warmup_steps = 100;  ///< qadam: exact Adam steps before the variance is frozen
  std::string peer_selection = "all";     ///< decentralized: all | shift_one
  int comm_interval = 1;                  ///< decentralized: average every this many steps
  int sync_interval_ms = 50;              ///< async: average models this often in the background
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  ///< qadam (the run's Adam settings)
  int bits = 8;                                     ///< bytegrad: bits per quantised element (8, 4, 2)
  int powersgd_rank = 4;                    ///< powersgd: rank of each gradient matrix's approximation
  std::int64_t powersgd_warmup_steps = 10;  ///< powersgd: exact allreduce steps before compressing
};

/// What an algorithm works on: the group's backend and the workload's replicated state (its parameters,
/// gradients and optimiser; workload/workload.hpp).
struct Context {
  comm::Backend& backend;
  workload::Workload& workload;
  comm::Options op;  ///< deadline of every collective
  /// The time of one step's computation without communication, in ms (for `auto`); measured lazily.
  std::function<double()> compute_ms;
  /// Writes an event line to the run's metrics (rank 0) and the log.
  std::function<void(const nlohmann::json&)> event;
  /// The optimiser step with a learning rate, where the runtime keeps the optimiser (a sharded state,
  /// train/shards.hpp); empty: the workload's own (Workload::optimizer_step).
  std::function<void(float lr)> optimizer_step;
  /// Replaces the allreduce of one gradient bucket (span, offset) over the backend, where the gradients
  /// are sharded (train/shards.hpp's ZeRO-2 reduce-scatter to the shards' holders); empty: the allreduce.
  /// The last argument: null for the exact reduction, ByteGrad's quantisation otherwise.
  std::function<void(comm::Backend&, std::span<float>, std::size_t, const Quantization*)> scatter_bucket;
};

class Algorithm {
 public:
  Algorithm(const Algorithm&) = delete;
  Algorithm& operator=(const Algorithm&) = delete;
  Algorithm(Algorithm&&) = delete;
  Algorithm& operator=(Algorithm&&) = delete;
  virtual ~Algorithm() = default;

  [[nodiscard]] virtual Kind kind() const = 0;
  /// Its name in kAlgorithmNames (metrics, logs).
  [[nodiscard]] std::string name() const { return std::string(name_of(kAlgorithmNames, kind())); }
  /// How its buckets are reduced when the gradients are in device memory (kNone: CPU only).
  [[nodiscard]] DeviceReduction device_reduction() const { return info(kind()).device; }
  /// Called before the forward pass of step `step` (1-based), on every rank.
  virtual void begin_step(std::int64_t /*step*/) {}
  /// Whether the gradients of step `step` (the one being trained, 1-based) are reduced bucket by bucket.
  [[nodiscard]] virtual bool reduces_gradients(std::int64_t step) const = 0;
  /// Reduces one gradient bucket (the sum over ranks, in place). `offset`: its position in the gradients.
  virtual void reduce_bucket(std::span<float> bucket, std::size_t offset) = 0;
  /// True if the buckets are best reduced by the backend's own allreduce (the bucketer's default path,
  /// with the MPI library's tuned algorithms) rather than by reduce_bucket().
  [[nodiscard]] virtual bool uses_backend_allreduce() const { return false; }
  /// The update. The gradients hold this rank's share of the global mean (the loss is divided by the
  /// step's global sample count) or, after reduce_bucket, the global mean itself. By default the
  /// workload's optimiser takes the step; an algorithm that owns the update (QAdam) overrides it.
  virtual void step(std::int64_t step, float lr);
  virtual void after_step(std::int64_t step);
  /// True if every completed step includes every rank's batch (a collective over all ranks in each step).
  /// False for the algorithms whose ranks complete steps on their own (local steps with model averaging,
  /// asynchronous averaging): after a failure the members then rewind to the last step every member
  /// completed (train::ReplicatedState::mark_agreed), so that no batch of a lost rank counts as trained
  /// without having been trained (the exactly-once audit).
  [[nodiscard]] virtual bool lockstep() const { return true; }
  /// Collective: every rank ends with the same parameters and optimiser state.
  virtual void consensus() {}
  /// After the trainer made the state equal on every rank: restart what depends on it.
  virtual void reset() {}
  /// Per-rank state for checkpoints, by name ("algo/..."); each span as large as the parameters.
  virtual std::vector<std::pair<std::string, std::span<float>>> rank_state() { return {}; }

  /// Bytes this rank sent for the algorithm since the last call (then zeroes the count).
  std::uint64_t take_bytes_sent() { return std::exchange(stats_.bytes_sent, 0); }

 protected:
  explicit Algorithm(Context ctx)
      : ctx_(std::move(ctx)), params_(ctx_.workload.params()), grads_(ctx_.workload.grads()) {}
  /// Averages params and optimiser state over the group (our ring's sum, then / size): afterwards every rank
  /// holds the same bits.
  void average_state();

  Context ctx_;
  std::span<float> params_;  ///< the workload's, in host memory
  std::span<float> grads_;
  CommStats stats_;
};

/// Builds the algorithm `opts.kind` over `ctx`. `auto` measures the achievable bandwidth (collective)
/// and returns the algorithm it chose, after logging the decision through ctx.event.
std::unique_ptr<Algorithm> make_algorithm(const AlgorithmOptions& opts, Context ctx);

/// shift_one's pairing: the peer of `rank` among `size` ranks in round `round` (a round-robin tournament,
/// so each round is a perfect matching and every pair meets once in size-1 rounds; with an odd size one
/// rank sits out each round). Returns -1 when `rank` has no peer this round.
int shift_one_peer(int rank, int size, std::int64_t round);

}  // namespace sinew::algo
