// What the training loop needs from whatever is trained: the seam between Sinew's runtime (sampler,
// collectives, algorithms, checkpoints, recovery) and a model.
//
// A workload keeps its parameters and their gradients in two flat float buffers of the same layout (core/
// flat.hpp), and its optimiser's state in named buffers of that size. Everything the runtime does to the
// replicated state -- reduce gradients bucket by bucket, step, checkpoint, send it to a replacement, average
// it -- it does to these spans, so it never needs to know the model or the optimiser.
//
// Implementations, each in the folder of what it wraps:
//   model/workload.hpp        Sinew's Eigen models on the CPU (logreg, mlp, cnn)
//   model/cuda/workload.hpp   the same models on a GPU (--device cuda; the host buffers are its record)
// A caller that owns forward and backward itself (a test's own model; the PyTorch integration) implements
// the state part and drives a train::Session directly: train() and evaluate() are then never called.
//
// Threads: every call comes from the training thread, except that the spans' memory is read and written by
// the communication thread between a range's ready report and the end of the step's reduction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sinew/core/flat.hpp"
#include "sinew/optim/optimizer.hpp"

struct CUevent_st;  // cudaEvent_t is CUevent_st*

namespace sinew::workload {

/// A range of the gradients is final (backward will not touch it again in this step): it may be reduced
/// in place now, while backward goes on.
using ReadyFn = std::function<void(Slice)>;
/// The same for gradients in device memory: final once `ready` (an event on the compute stream) completes.
using DeviceReadyFn = std::function<void(Slice, CUevent_st* ready)>;

/// Distillation's targets for one micro-batch: per sample the teacher's logits (classes floats each) and
/// whether it has them (a sample without is trained on its label alone).
struct Teacher {
  std::span<const float> logits;
  std::span<const std::uint8_t> present;
  float alpha = 0.5f;        ///< weight of the label term
  float temperature = 4.0f;  ///< softening of both distributions
};

/// One micro-batch of a step, as the sampler gave it to this rank.
struct MicroBatch {
  std::span<const std::size_t> indices;  ///< training-set samples (may be empty: see train())
  double denominator = 1;                ///< the step's GLOBAL sample count (see train())
  bool accumulate = false;               ///< add to the gradients instead of overwriting them
};

/// What train() calls back into; every member may be empty.
struct TrainHooks {
  /// Between the forward and the backward pass of a non-empty micro-batch (fault injection's "backward").
  std::function<void()> before_backward;
  /// Distillation: after the forward pass, the teacher's targets for the micro-batch's samples.
  std::function<Teacher()> teacher;
  /// Per gradient range in ready order as it becomes final (only for a step's last micro-batch): on the
  /// host (ready) or, for a workload on a device, in device memory (device_ready).
  ReadyFn ready;
  DeviceReadyFn device_ready;
};

/// Sums over a chunk of the test set.
struct EvalSums {
  double loss = 0;          ///< sum of the per-sample losses
  std::size_t correct = 0;  ///< samples whose prediction is their label
};

/// What a built-in workload (model/workload.hpp) is made of; train::model_spec() fills it from the
/// command line.
struct ModelSpec {
  std::string model = "mlp";          ///< model::Model::build's spec
  optim::OptimizerOptions optimizer;  ///< sgd | adam and their settings
  std::string device = "cpu";         ///< cpu | cuda
  std::uint64_t seed = 42;            ///< the initial parameters
  /// --shard optimizer: the runtime keeps the optimiser's state, sharded (train/shards.hpp); the workload
  /// is built without one (has_optimizer() false).
  bool shard_optimizer = false;
};

class Workload {
 public:
  Workload() = default;
  Workload(const Workload&) = delete;
  Workload& operator=(const Workload&) = delete;
  Workload(Workload&&) = delete;
  Workload& operator=(Workload&&) = delete;
  virtual ~Workload() = default;

  // ---- the flat layout ----------------------------------------------------------------------------------
  /// "mlp (669 706 parameters)": for logs.
  [[nodiscard]] virtual std::string describe() const = 0;
  /// The gradient ranges in the order backward finishes them (last layer first). Together they cover
  /// [0, params().size()) exactly once; the bucketer groups adjacent ones into buckets.
  [[nodiscard]] virtual std::vector<Slice> ready_order() const = 0;
  /// The parameters as named, shaped tensors of "params", in flat order, covering it exactly once:
  /// a checkpoint's per-tensor views, PowerSGD's matrices, the names in error messages.
  [[nodiscard]] virtual std::vector<TensorView> views() const = 0;
  /// The model as one line of JSON for checkpoint readers (docs/checkpoint-format.md); "" if it has none.
  [[nodiscard]] virtual std::string description_json() const { return {}; }

  // ---- the replicated state, in host memory -------------------------------------------------------------
  /// The parameters: one buffer that stays where it is for the workload's life.
  [[nodiscard]] virtual std::span<float> params() = 0;
  /// The gradients (params()' layout). A workload on a device keeps its own in device memory
  /// (attach_device()); this buffer is then unused by the runtime.
  [[nodiscard]] virtual std::span<float> grads() = 0;
  /// The optimiser's name ("sgd", "adam", or a caller's own) for messages.
  [[nodiscard]] virtual std::string optimizer_name() const = 0;
  /// Whether it keeps and steps its optimiser itself; false for a workload built for a sharded optimiser
  /// state (ModelSpec::shard_optimizer), whose optimizer_state() is then empty and whose steps the runtime
  /// takes (train/shards.hpp).
  [[nodiscard]] virtual bool has_optimizer() const { return true; }
  /// Whether its flat parameter and gradient buffers give pages back (core/pages.hpp's memory) and its
  /// forward and backward gather the parameters unit by unit: --shard parameters (train/shards.hpp).
  [[nodiscard]] virtual bool can_shard_parameters() const { return false; }
  /// Told so once, when the runtime shards the parameters (before the first step).
  virtual void shard_parameters() {}
  /// A workload without an optimiser of its own (has_optimizer() false) whose optimiser is of a kind the
  /// runtime does not know (the PyTorch integration's torch.optim optimiser): an optimiser of that kind over
  /// the elements `range` of the flat buffers, with state for them only. Null (the default): the runtime
  /// uses its own (--optimizer) over the range. `place`: how its state buffers are made.
  [[nodiscard]] virtual std::unique_ptr<optim::Optimizer> shard_optimizer(
      Slice range, const optim::StatePlacement& place) {
    (void)range;
    (void)place;
    return nullptr;
  }
  /// The optimiser's state buffers by name, each as large as the parameters, in a fixed order ("momentum";
  /// "adam_m", "adam_v"): checkpoints hold them as "optim/<name>", a replacement receives them, relaxed
  /// algorithms average them. Writing through the spans changes the optimiser's state.
  [[nodiscard]] virtual NamedSpans optimizer_state() = 0;
  /// The optimiser's own step count (Adam's bias correction); restored by set_optimizer_steps().
  [[nodiscard]] virtual std::int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(std::int64_t steps) = 0;
  /// The optimiser step over the whole buffer with learning rate `lr` (the gradients hold the global mean,
  /// or this rank's share of it for the algorithms that step on local gradients); increments the steps.
  virtual void optimizer_step(float lr) = 0;

  /// State of the model that is not trained but must be the same on every rank (BatchNorm's running
  /// statistics), by name, each of any size: checkpoints hold them as "buffers/<name>", a replacement
  /// receives them, and the session makes every rank's rank 0's after each step (as DDP broadcasts its
  /// module buffers). None by default.
  [[nodiscard]] virtual NamedSpans buffers() { return {}; }
  /// State beside the tensors, as text, that checkpoints carry (the Python package's LR scheduler and
  /// registered objects); load_extra_state() gets it back on a resume. Default: none.
  [[nodiscard]] virtual std::string extra_state() const { return {}; }
  [[nodiscard]] virtual bool has_extra_state() const { return false; }
  virtual void load_extra_state(const std::string& text) { (void)text; }
  /// A workload on a device: copies the buffers device -> host before the runtime reads buffers(), and back
  /// after it wrote them (the broadcast after each step). No-ops on the host.
  virtual void buffers_to_host() {}
  virtual void buffers_to_device() {}

  /// The state buffer `name` of the optimiser, for `who` (an algorithm) that cannot work without it.
  /// Throws InvalidArgument naming `who`, the buffer, the optimiser and the buffers it has.
  std::span<float> optimizer_state(std::string_view name, std::string_view who);

  // ---- computation (the built-in training loop) ---------------------------------------------------------
  /// Forward, loss divided by `batch.denominator`, backward on `batch.indices` of the training set: the
  /// gradients (overwritten, or added to with `accumulate`) hold this rank's share of the step's mean, so
  /// that their sum over the ranks is the global mean. Returns this rank's share of the mean loss. An
  /// empty micro-batch contributes nothing (zero gradients unless accumulating) and still reports every
  /// range. Throws InvalidArgument for a workload that does not train itself (a caller-driven one).
  virtual float train(const MicroBatch& batch, const TrainHooks& hooks);
  /// Loss and correct predictions over `indices` of the test set; leaves the parameters and gradients'
  /// meaning untouched. Throws InvalidArgument like train().
  virtual EvalSums evaluate(std::span<const std::size_t> indices);

  // ---- a device ----------------------------------------------------------------------------------------
  /// Whether the gradients are reduced in device memory (attach_device() returns them).
  [[nodiscard]] virtual bool on_device() const { return false; }
  /// The GPU it trains on; -1 before attach_device() or on the host.
  [[nodiscard]] virtual int device() const { return -1; }
  /// GPUs this process can see (the group picks one per member among them); 0 on the host.
  [[nodiscard]] virtual int visible_devices() const { return 0; }
  /// Moves the training onto GPU `index` the first time (copying the host state there); later calls keep
  /// it. Returns the gradients in device memory. Throws InvalidArgument for a host-only workload.
  virtual float* attach_device(int index);
  /// Copies the state (parameters, optimiser state and steps) device -> host before the runtime reads the
  /// host buffers, and back after it wrote them. No-ops on the host.
  virtual void to_host() {}
  virtual void to_device() {}
  /// A sharded optimiser state on a device (--shard optimizer|gradients with --device cuda): its shards are
  /// updated on the host (train/shards.hpp), so the reduced gradients of the held `ranges` come device ->
  /// grads() and the updated parameters of those ranges go params() -> device. The parameters in device
  /// memory (params()' layout) are what the runtime all-gathers there afterwards. No-ops, and empty, on the
  /// host; a device workload that cannot shard its optimiser state keeps them so (the options refuse it).
  virtual void grads_to_host(std::span<const Slice> ranges) { (void)ranges; }
  virtual void params_to_device(std::span<const Slice> ranges) { (void)ranges; }
  [[nodiscard]] virtual std::span<float> device_params() { return {}; }
};

}  // namespace sinew::workload
