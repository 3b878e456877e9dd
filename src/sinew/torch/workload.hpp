// A PyTorch model as a Sinew workload: its parameters and their gradients become views into Sinew's flat
// parameter and gradient buffers, so that the optimiser, the bucketed reduction, the checkpoint writer and
// the state sync of a replacement all work on the memory autograd writes, with no copy per step.
//
//   flat params   [ conv1.weight | bn1.weight | bn1.bias | ... | fc.bias ]   (the module's order)
//   flat grads    the same layout; autograd accumulates into it in place
//   ready order   the reverse: backward finishes the last layer first
//
// The module's order is a guess at backward's: a transformer layer registers norm1 before linear1 and
// linear2, but its backward finishes linear2, linear1, then norm1. Before training, probe_ready_order() runs
// one backward pass, records the order in which the hooks fire, and lays the flat buffers out in its
// reverse, so that every bucket is one contiguous range that is complete as early as backward allows (what
// DDP does when it rebuilds its buckets after the first iteration). Job does this before the session
// starts, on every rank and every replacement alike (autograd's order is a function of the graph).
//
// A post-accumulate-grad hook on every parameter reports its range as final (workload::ReadyFn, the
// session's grad_ready) in the step's last micro-batch, after scaling it to this rank's share of the
// step's mean: users write the usual loss (the mean over their micro-batch) and Sinew makes the sum over
// ranks the exact global mean, also when the last step of an epoch gives ranks unequal batches.
//
// Float32 parameters, all on the CPU or all on one GPU. Module buffers that are floats (BatchNorm's running
// mean and variance) live in a third flat buffer: rank 0's are every rank's after each step, checkpoints hold
// them and replacements receive them.
//
// On a GPU (a model moved with .cuda() before it is wrapped, in a build with CUDA) the flat buffers are in
// device memory, as autograd writes them, and the workload is on_device(): each range is reported with a
// CUDA event recorded on the stream its gradient's last kernel ran on (workload::DeviceReadyFn), the
// fabric's DeviceBucketer reduces the buckets with NCCL in device memory once their events complete (no copy
// to the host), and the fused optimiser runs there (TensorOptimizer). Host copies of the parameters, the
// optimiser's state and the buffers are the runtime's record, as for --device cuda (model/cuda/workload.hpp):
// to_host() before checkpoints and state syncs read them, to_device() after they wrote them.
//
// Used from C++ (TorchWorkload::of(module)) and from Python (python/, through the same class).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sinew/optim/optimizer.hpp"
#include "sinew/torch/tensor_optimizer.hpp"
#include "sinew/workload/workload.hpp"

namespace torch::nn {
class Module;
}

namespace sinew::pytorch {

/// A tensor of the model with its name in the module ("layer1.0.conv1.weight").
struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

/// Records the events that say a gradient range is final, on the stream that wrote it (a workload on a GPU).
/// The CUDA one records on torch's current stream (cuda_ready_events); tests record the fake NCCL's.
class ReadyEvents {
 public:
  ReadyEvents() = default;
  ReadyEvents(const ReadyEvents&) = delete;
  ReadyEvents& operator=(const ReadyEvents&) = delete;
  ReadyEvents(ReadyEvents&&) = delete;
  ReadyEvents& operator=(ReadyEvents&&) = delete;
  virtual ~ReadyEvents() = default;
  /// Parameter `i`'s event, recorded now on the current stream (one per parameter, recorded again every
  /// step: its consumer waits for it on the GPU before the next record).
  virtual CUevent_st* record(std::size_t i) = 0;
};

/// Where a workload on a device trains: its GPU, how many the process sees, and its events.
struct Device {
  int index = 0;
  int visible = 1;
  std::unique_ptr<ReadyEvents> events;
};

/// One CUDA event per parameter on GPU `index`, recorded on torch's current CUDA stream. Throws
/// InvalidArgument in a build of Sinew without CUDA (naming what to do).
std::unique_ptr<ReadyEvents> cuda_ready_events(int index, std::size_t parameters);

/// An optimiser that is not one of Sinew's (a torch.optim one, adopted by the Python package): its per-
/// parameter state lives in flat tensors of the parameters' layout, named by its keys ("momentum_buffer",
/// "exp_avg"), so that replacements receive it and checkpoints hold it.
struct ExternalOptimizer {
  std::string name;
  std::vector<NamedTensor> state;       ///< flat float32 tensors, each as large as the parameters
  std::function<void(float lr)> step;   ///< one update from the gradients with learning rate lr
  std::function<std::int64_t()> steps;  ///< its step count (Adam's bias correction)
  std::function<void(std::int64_t)> set_steps;
  /// After the layout changed (probe_ready_order): the state tensors hold the same values per parameter at
  /// the parameters' new offsets; per-parameter views of them must be made again. Empty: such an optimiser
  /// keeps the module's order (the layout is not changed under it).
  std::function<void()> relayout;
};

/// A script's optimiser over one range of the flat buffers, for a sharded state (train/shards.hpp): an
/// ExternalOptimizer whose state tensors are the range's size.
using ShardFactory = std::function<ExternalOptimizer(Slice range, const optim::StatePlacement& place)>;

class TorchWorkload final : public workload::Workload {
 public:
  /// Takes over `params` (the trainable ones, in the module's order) and `buffers` (its float buffers):
  /// their values are copied into the flat buffers and each tensor's storage becomes a view of them. The
  /// optimiser is one of Sinew's fused ones over the flat buffer. `model` names the model in logs.
  /// Tensors on a GPU make the workload on_device() (the CUDA events of cuda_ready_events()).
  /// Throws InvalidArgument for a parameter that is not float32, tensors on different devices, or a GPU in a
  /// build without CUDA (naming the tensor and what to do).
  TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                const optim::OptimizerOptions& optimizer, std::string model);
  /// The same for a sharded optimiser state (shard_state() from the start: Sinew's fused optimiser's whole
  /// state is never allocated, which for a large model would double its memory at this point). On a GPU the
  /// shards are stepped on the host record (host_params(), host_grads()); `parameters` (--shard parameters)
  /// is refused there with InvalidArgument.
  struct Sharded {
    bool parameters = false;
  };
  TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                const optim::OptimizerOptions& optimizer, std::string model, Sharded);
  /// The same on `device`, whatever memory the tensors are in: the device path over host memory, for tests
  /// with the fake NCCL (tests/mpi/nccl_fake.hpp), whose "device memory" is host memory.
  TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                const optim::OptimizerOptions& optimizer, std::string model, Device device);
  /// A C++ module: its named_parameters() that require a gradient, and its float named_buffers().
  static std::unique_ptr<TorchWorkload> of(torch::nn::Module& module,
                                           const optim::OptimizerOptions& optimizer,
                                           std::string model = "a torch::nn::Module");
  TorchWorkload(const TorchWorkload&) = delete;  // the hooks and the tensors' storage point at it
  TorchWorkload& operator=(const TorchWorkload&) = delete;
  TorchWorkload(TorchWorkload&&) = delete;
  TorchWorkload& operator=(TorchWorkload&&) = delete;
  ~TorchWorkload() override;

  // ---- workload::Workload ---------------------------------------------------------------------------
  [[nodiscard]] std::string describe() const override;
  [[nodiscard]] std::vector<Slice> ready_order() const override;
  [[nodiscard]] std::vector<TensorView> views() const override { return views_; }
  [[nodiscard]] std::span<float> params() override;
  [[nodiscard]] std::span<float> grads() override;
  [[nodiscard]] std::string optimizer_name() const override;
  [[nodiscard]] NamedSpans optimizer_state() override;
  [[nodiscard]] std::int64_t optimizer_steps() const override;
  void set_optimizer_steps(std::int64_t steps) override;
  void optimizer_step(float lr) override;
  /// Replaces Sinew's fused optimiser with `o` (before training starts). Throws InvalidArgument for a state
  /// tensor that is not a float32 CPU tensor of the parameters' size, or a missing function.
  void use_optimizer(ExternalOptimizer o);

  /// --shard optimizer: the runtime keeps the optimiser's state, sharded (train/shards.hpp). Frees Sinew's
  /// fused optimiser; until use_sharded_optimizer() the runtime's own (--optimizer) is used per shard.
  /// Throws InvalidArgument on a device (not yet).
  void shard_state();
  [[nodiscard]] bool has_optimizer() const override { return !sharded_; }
  /// --shard parameters: on the CPU, where the flat buffers are core/pages.hpp's memory.
  [[nodiscard]] bool can_shard_parameters() const override { return !device_.has_value(); }
  /// Then the gradients are zeroed by giving their pages back (zero_grads()).
  void shard_parameters() override;
  /// Zeroes the flat gradients (a step's first micro-batch; the script's zero_grad()): with sharded
  /// parameters by releasing their memory, which backward takes again range by range as it writes them.
  void zero_grads();
  /// With shard_state(): the script's optimiser `name`, made per shard by `make`.
  void use_sharded_optimizer(std::string name, ShardFactory make);
  [[nodiscard]] std::unique_ptr<optim::Optimizer> shard_optimizer(
      Slice range, const optim::StatePlacement& place) override;
  [[nodiscard]] NamedSpans buffers() override;
  void buffers_to_host() override;
  void buffers_to_device() override;

  /// The Python package's state beside the tensors (its scheduler, registered objects), as text: made by
  /// `provider` when a checkpoint is written (from the state it kept at the last step boundary); `loader`
  /// receives it on a resume.
  [[nodiscard]] std::string extra_state() const override {
    return extra_state_ ? extra_state_() : std::string();
  }
  [[nodiscard]] bool has_extra_state() const override { return static_cast<bool>(extra_state_); }
  void load_extra_state(const std::string& text) override {
    if (extra_loader_) extra_loader_(text);
  }
  void set_extra_state(std::function<std::string()> provider) { extra_state_ = std::move(provider); }
  void set_extra_loader(std::function<void(const std::string&)> loader) { extra_loader_ = std::move(loader); }

  // ---- a device ----------------------------------------------------------------------------------------
  [[nodiscard]] bool on_device() const override { return device_.has_value(); }
  [[nodiscard]] int device() const override { return device_ ? device_->index : -1; }
  [[nodiscard]] int visible_devices() const override { return device_ ? device_->visible : 0; }
  /// The gradients in device memory; `index` must be the model's GPU (a member keeps its GPU).
  float* attach_device(int index) override;
  void to_host() override;
  void to_device() override;
  void grads_to_host(std::span<const Slice> ranges) override;
  void params_to_device(std::span<const Slice> ranges) override;
  [[nodiscard]] std::span<float> device_params() override;

  // ---- a step, driven by the caller -----------------------------------------------------------------
  /// Where the hooks report final ranges (the session's grad_ready): on the host `ready`, on a device
  /// `device_ready` (with the range's event). Empty: they report nothing.
  void set_ready(workload::ReadyFn ready) { ready_ = std::move(ready); }
  void set_device_ready(workload::DeviceReadyFn ready) { device_ready_ = std::move(ready); }
  /// Called once per step, right after the first range is reported: the point "backward" of fault
  /// injection (a rank dies while buckets are in flight).
  void set_first_ready(std::function<void()> fn) { first_ready_ = std::move(fn); }
  /// Before micro-batch `j` of a step's `micro_batches`: `samples` of this rank's in it, `total` in the
  /// whole step over all ranks. The first zeroes the gradients (and points every parameter's .grad at its
  /// view again, should the script have set it to None); the last arms the ready hooks.
  void begin_micro_batch(std::size_t j, std::size_t micro_batches, std::size_t samples, std::size_t total);
  /// A micro-batch without samples on this rank (the epoch's last step): nothing to compute, and in the
  /// last micro-batch every range not yet reported is reported (with the gradients accumulated so far).
  void skip_micro_batch();
  /// The current micro-batch weighs nothing (a rank without samples in a step still runs it, on a stand-in
  /// sample, so that the script's loop stays in step with the group's): its gradients are scaled by 0.
  void mute() noexcept { scale_ = 0; }
  /// The step's backward passes are over: hooks report nothing until the next step's last micro-batch.
  void disarm() noexcept { armed_ = false; }
  /// Called once when the backward pass that reported the step's first range is over (queued on autograd's
  /// engine as DDP queues its final callback): the caller's own loop finishes the reduction there, so that
  /// `.grad` holds the reduced gradient when backward() returns. Empty: nothing is queued.
  void set_backward_done(std::function<void()> fn) { backward_done_ = std::move(fn); }
  /// The ranges reported since the last micro-batch began.
  [[nodiscard]] std::size_t reported() const noexcept { return reported_; }
  /// Parameters (and their ranges) that no hook reported in the last micro-batch: unused parameters.
  [[nodiscard]] std::vector<std::string> unreported() const;

  // ---- the bucket order -------------------------------------------------------------------------------
  /// Runs `backward_pass` (one forward and backward of the caller's, outside any step), records the order
  /// in which the parameters' gradients become final, and lays the flat buffers out in its reverse (see the
  /// top of this file). Values, gradients' ties and the optimiser's state move with their parameters; the
  /// buffers (BatchNorm's statistics, which the pass updated) and the gradients are as before. Parameters
  /// the pass left without a gradient come last in the ready order. Returns how many tensors moved; 0 with
  /// an external optimiser that cannot follow (ExternalOptimizer::relayout empty).
  std::size_t probe_ready_order(const std::function<void()>& backward_pass);

  /// Keeps a copy of the module's float buffers (BatchNorm's running statistics) and of `also_keep()`'s
  /// tensors (its integer buffers: num_batches_tracked) as of a completed step; restore_buffers() puts them
  /// back (after a failure, the lost step's forward passes must not count: the redo counts its batch once).
  void keep_buffers();
  void restore_buffers();
  void also_keep(std::vector<at::Tensor> tensors) { others_ = std::move(tensors); }

  /// The flat buffers as tensors (views of the same memory; on a device, in device memory).
  [[nodiscard]] const at::Tensor& flat_params() const noexcept { return flat_params_; }
  [[nodiscard]] const at::Tensor& flat_grads() const noexcept { return flat_grads_; }
  /// The flat parameters and gradients a sharded optimiser steps (shard_optimizer()'s views): flat_params()
  /// and flat_grads() on the CPU; on a GPU their host record, which the session fills with the held ranges'
  /// reduced gradients before the step and copies to the device after it.
  [[nodiscard]] const at::Tensor& host_params() const noexcept { return host_params_; }
  [[nodiscard]] const at::Tensor& host_grads() const noexcept { return host_grads_; }
  /// The optimiser's state tensors where training uses them (on a device: there), in optimizer_state()'s
  /// order. On the host with Sinew's fused optimiser: views of its buffers.
  [[nodiscard]] std::vector<at::Tensor> state_tensors();
  [[nodiscard]] std::size_t num_params() const noexcept { return slices_.size(); }

  /// A parameter's gradient is final (called by its hook).
  void on_grad(std::size_t i, const at::Tensor& param);

 private:
  void init(const optim::OptimizerOptions& optimizer, bool sharded = false);
  /// The GPU the tensors are on (with its ready events), or none on the CPU.
  [[nodiscard]] std::optional<Device> device_of_tensors() const;
  [[nodiscard]] std::string optimizer_name_unsharded() const;  // Sinew's fused optimiser's
  void report(std::size_t i);

  std::vector<NamedTensor> params_, buffer_tensors_;
  std::vector<Slice> slices_;         // params_[i]'s range of the flat buffers
  std::vector<Slice> buffer_slices_;  // buffer_tensors_[i]'s range of flat_buffers_
  std::vector<TensorView> views_;
  std::string model_;
  at::Tensor flat_params_, flat_grads_, flat_buffers_;
  at::Tensor kept_buffers_;  // keep_buffers()
  std::vector<at::Tensor> others_, kept_others_;
  std::optional<Device> device_;
  // The runtime's record in host memory: on the host the flat tensors themselves; on a device their copies
  // (to_host, to_device), and host_state_ those of the optimiser's state.
  at::Tensor host_params_, host_grads_, host_buffers_;
  std::vector<at::Tensor> host_state_;
  std::unique_ptr<optim::Optimizer> optimizer_;        // on the host
  std::unique_ptr<TensorOptimizer> device_optimizer_;  // on a device
  std::optional<ExternalOptimizer> external_;
  bool sharded_ = false;       // shard_state()
  bool sparse_grads_ = false;  // shard_parameters()
  bool fresh_grads_ = false;   // the gradients were never written (zero_grads() has nothing to do)
  bool shards_made_ = false;   // the runtime asked for a shard's optimiser
  std::string sharded_name_;   // use_sharded_optimizer()
  ShardFactory shard_factory_;
  workload::ReadyFn ready_;
  workload::DeviceReadyFn device_ready_;
  std::function<void()> first_ready_;
  std::function<void()> backward_done_;
  std::function<std::string()> extra_state_;
  std::function<void(const std::string&)> extra_loader_;
  std::vector<std::size_t> order_;  // parameters in the order their gradients become final (ready order)
  std::vector<std::size_t> probe_;  // the order the hooks fired in probe_ready_order()'s pass
  std::vector<bool> done_;          // per parameter: reported in the current micro-batch
  bool probing_ = false;            // probe_ready_order(): the hooks record the order
  std::size_t reported_ = 0;
  bool armed_ = false;  // the step's last micro-batch: hooks report
  float scale_ = 1;     // the current micro-batch's share of the step's mean: samples / total
};

}  // namespace sinew::pytorch
