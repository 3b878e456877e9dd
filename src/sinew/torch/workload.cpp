#include "sinew/torch/workload.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/core/pages.hpp"

namespace sinew::pytorch {

namespace {

/// Reports a parameter's gradient as final once autograd has accumulated it.
class ReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  ReadyHook(TorchWorkload& work, std::size_t index) : work_(work), index_(index) {}
  void operator()(const torch::autograd::Variable& param) override { work_.on_grad(index_, param); }

 private:
  TorchWorkload& work_;
  std::size_t index_;
};

std::vector<std::size_t> shape_of(const at::Tensor& t) {
  std::vector<std::size_t> s;
  for (const std::int64_t d : t.sizes()) s.push_back(static_cast<std::size_t>(d));
  return s;
}

void check_parameter(const NamedTensor& p) {
  const at::Tensor& t = p.tensor;
  if (!t.defined()) SINEW_THROW(InvalidArgument, "parameter '{}' is an undefined tensor", p.name);
  if (t.layout() != at::kStrided) {
    SINEW_THROW(InvalidArgument, "parameter '{}' is a sparse tensor: Sinew trains dense parameters only",
                p.name);
  }
  if (t.scalar_type() != at::kFloat) {
    SINEW_THROW(InvalidArgument,
                "parameter '{}' is {}, not float32: Sinew's flat buffers hold float32 (mixed precision runs "
                "inside the model, e.g. under torch.autocast); convert the model with .float() before "
                "wrapping it",
                p.name, c10::toString(t.scalar_type()));
  }
}

/// The one device of the model's tensors; InvalidArgument naming the first tensor elsewhere, or a device
/// that is neither the CPU nor a GPU.
c10::Device device_of(const std::vector<NamedTensor>& params, const std::vector<NamedTensor>& buffers) {
  const c10::Device d = params.front().tensor.device();
  if (!d.is_cpu() && !d.is_cuda()) {
    SINEW_THROW(InvalidArgument, "parameter '{}' is on {}: Sinew trains on the CPU or on CUDA GPUs",
                params.front().name, d.str());
  }
  for (const auto* list : {&params, &buffers}) {
    for (const NamedTensor& t : *list) {
      if (t.tensor.device() != d) {
        SINEW_THROW(InvalidArgument,
                    "'{}' is on {}, '{}' on {}: Sinew trains a model on one device; move it with .to() "
                    "before wrapping it",
                    t.name, t.tensor.device().str(), params.front().name, d.str());
      }
    }
  }
  return d;
}

/// `n` float zeros on the CPU in memory of their own (core/pages.hpp): no page is taken before it is
/// written, and release_pages() gives pages back (--shard parameters).
at::Tensor mapped_zeros(std::size_t n) {
  float* p = map_pages(n);
  return at::from_blob(
      p, {static_cast<std::int64_t>(n)}, [n](void* q) { free_pages(static_cast<float*>(q), n); },
      at::TensorOptions().dtype(at::kFloat));
}

/// Copies the tensors' values into one new flat float buffer on `device` and makes each tensor a view of
/// its range.
at::Tensor flatten(std::vector<NamedTensor>& tensors, std::vector<Slice>& slices, c10::Device device) {
  std::size_t n = 0;
  for (const NamedTensor& t : tensors) {
    slices.push_back({n, static_cast<std::size_t>(t.tensor.numel())});
    n += slices.back().count;
  }
  at::Tensor flat = device.is_cpu() ? mapped_zeros(n)
                                    : at::empty({static_cast<std::int64_t>(n)},
                                                at::TensorOptions().dtype(at::kFloat).device(device));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor& t = tensors[i].tensor;
    at::Tensor view = flat.narrow(0, static_cast<std::int64_t>(slices[i].offset),
                                  static_cast<std::int64_t>(slices[i].count))
                          .view(t.sizes());
    {
      at::NoGradGuard no_grad;
      view.copy_(t);
    }
    t.set_data(view);
    // The tensor's own memory is free now: give it back before the next one is copied, so that the model is
    // not held twice at once (a large model's peak is then its size plus one tensor's).
    if (device.is_cpu() && view.nbytes() >= (1u << 20)) trim_heap();
  }
  return flat;
}

std::span<float> span_of(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

at::Tensor range_of(const at::Tensor& flat, Slice r) {
  return flat.narrow(0, static_cast<std::int64_t>(r.offset), static_cast<std::int64_t>(r.count));
}

/// A CPU copy of `t` (the host record of a tensor in device memory).
at::Tensor host_copy(const at::Tensor& t) { return t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true); }

/// Moves range from[i] of `flat` to range to[i], for every i (a permutation of equal-sized ranges).
void move_ranges(const at::Tensor& flat, const std::vector<Slice>& from, const std::vector<Slice>& to) {
  at::NoGradGuard no_grad;
  const at::Tensor old = flat.clone();
  for (std::size_t i = 0; i < from.size(); ++i) range_of(flat, to[i]).copy_(range_of(old, from[i]));
}

at::Tensor tensor_of(std::span<float> s) {
  return at::from_blob(s.data(), {static_cast<std::int64_t>(s.size())},
                       at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

#ifndef SINEW_TORCH_CUDA  // else torch/cuda/ready_events.cpp
std::unique_ptr<ReadyEvents> cuda_ready_events(int index, std::size_t /*parameters*/) {
  SINEW_THROW(InvalidArgument,
              "the model is on cuda:{}, and this build of Sinew has no CUDA support: build it where the CUDA "
              "toolkit and nccl.h are found (docs/gpu.md), or move the model with .cpu() before wrapping it",
              index);
}
#endif

TorchWorkload::TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                             const optim::OptimizerOptions& optimizer, std::string model)
    : params_(std::move(params)), buffer_tensors_(std::move(buffers)), model_(std::move(model)) {
  if (params_.empty()) SINEW_THROW(InvalidArgument, "{} has no parameters that require a gradient", model_);
  for (const NamedTensor& p : params_) check_parameter(p);
  device_ = device_of_tensors();
  init(optimizer);
}

std::optional<Device> TorchWorkload::device_of_tensors() const {
  const c10::Device d = device_of(params_, buffer_tensors_);
  if (!d.is_cuda()) return std::nullopt;
  const int index = d.has_index() ? d.index() : 0;
  return Device{index, static_cast<int>(torch::cuda::device_count()),
                cuda_ready_events(index, params_.size())};
}

TorchWorkload::TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                             const optim::OptimizerOptions& optimizer, std::string model, Sharded sharded)
    : params_(std::move(params)), buffer_tensors_(std::move(buffers)), model_(std::move(model)) {
  if (params_.empty()) SINEW_THROW(InvalidArgument, "{} has no parameters that require a gradient", model_);
  for (const NamedTensor& p : params_) check_parameter(p);
  if (sharded.parameters && device_of(params_, buffer_tensors_).is_cuda()) {
    SINEW_THROW(
        InvalidArgument,
        "shard=\"parameters\": the model is on a GPU, and sharded parameters are gathered and released "
        "in host memory (PyTorch models on the CPU); use shard=\"gradients\" or \"optimizer\" on the "
        "GPU (the optimizer's state sharded on the host), or train on the CPU");
  }
  device_ = device_of_tensors();
  init(optimizer, /*sharded=*/true);
}

TorchWorkload::TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                             const optim::OptimizerOptions& optimizer, std::string model, Device device)
    : params_(std::move(params)), buffer_tensors_(std::move(buffers)), model_(std::move(model)) {
  if (params_.empty()) SINEW_THROW(InvalidArgument, "{} has no parameters that require a gradient", model_);
  for (const NamedTensor& p : params_) check_parameter(p);
  (void)device_of(params_, buffer_tensors_);
  if (!device.events) SINEW_THROW(InvalidArgument, "{}: a device without its ready events", model_);
  device_ = std::move(device);
  init(optimizer);
}

void TorchWorkload::init(const optim::OptimizerOptions& optimizer, bool sharded) {
  for (const NamedTensor& b : buffer_tensors_) {
    if (b.tensor.scalar_type() != at::kFloat)
      SINEW_THROW(InvalidArgument, "buffer '{}' must be float32 (it is {})", b.name,
                  c10::toString(b.tensor.scalar_type()));
  }
  const c10::Device d = params_.front().tensor.device();
  flat_params_ = flatten(params_, slices_, d);
  flat_buffers_ = flatten(buffer_tensors_, buffer_slices_, d);
  flat_grads_ = d.is_cpu() ? mapped_zeros(static_cast<std::size_t>(flat_params_.numel()))
                           : at::zeros_like(flat_params_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    views_.push_back({params_[i].name, "params", slices_[i].offset, shape_of(params_[i].tensor), ""});
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i].tensor, std::make_unique<ReadyHook>(*this, i));
  }
  for (std::size_t i = params_.size(); i-- > 0;) order_.push_back(i);  // the module's order, reversed
  done_.assign(params_.size(), false);
  if (device_) {
    host_params_ = host_copy(flat_params_);
    // The layout's size for the runtime; the sharded update's held ranges (step_shards: grads_to_host).
    host_grads_ = at::zeros_like(host_params_);
    host_buffers_ = host_copy(flat_buffers_);
    if (!sharded) {
      device_optimizer_ = std::make_unique<TensorOptimizer>(optimizer, flat_params_);
      for (const at::Tensor& t : state_tensors()) host_state_.push_back(host_copy(t));
    }
  } else {
    host_params_ = flat_params_;
    host_grads_ = flat_grads_;
    host_buffers_ = flat_buffers_;
    if (!sharded)
      optimizer_ = optim::make_optimizer(optimizer, static_cast<std::size_t>(flat_params_.numel()));
  }
  if (sharded) {  // the runtime holds the state, by shards (on a device: their update on the host)
    sharded_ = true;
    sharded_name_ = optim::make_optimizer(optimizer, 0)->name();
  }
  fresh_grads_ = d.is_cpu();      // mapped zeros: no page of them is taken before backward writes it
  begin_micro_batch(0, 1, 0, 1);  // .grad of every parameter: its view, zero
  armed_ = false;                 // a backward outside a step reports nothing
}

TorchWorkload::~TorchWorkload() {
  // The hooks point at this object: a module that outlives the workload must not call them.
  for (NamedTensor& p : params_) {
    if (p.tensor.defined()) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }
}

std::unique_ptr<TorchWorkload> TorchWorkload::of(torch::nn::Module& module,
                                                 const optim::OptimizerOptions& optimizer,
                                                 std::string model) {
  std::vector<NamedTensor> params, buffers;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (item.value().requires_grad()) params.push_back({item.key(), item.value()});
  }
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (item.value().scalar_type() == at::kFloat) buffers.push_back({item.key(), item.value()});
  }
  return std::make_unique<TorchWorkload>(std::move(params), std::move(buffers), optimizer, std::move(model));
}

std::string TorchWorkload::describe() const {
  return fmt::format("{} ({} parameters in {} tensors{})", model_, flat_params_.numel(), params_.size(),
                     device_ ? fmt::format(", on GPU {}", device_->index) : "");
}

std::vector<Slice> TorchWorkload::ready_order() const {
  // The module's order reversed (backward finishes the output layers first), or the probed one.
  std::vector<Slice> out;
  out.reserve(order_.size());
  for (const std::size_t i : order_) out.push_back(slices_[i]);
  return out;
}

std::size_t TorchWorkload::probe_ready_order(const std::function<void()>& backward_pass) {
  const at::Tensor statistics = flat_buffers_.clone();
  begin_micro_batch(0, 2, 0, 1);  // zero gradients; not a step's last micro-batch: nothing is reported
  probe_.clear();
  probing_ = true;
  try {
    backward_pass();
  } catch (...) {
    probing_ = false;
    flat_buffers_.copy_(statistics);
    throw;
  }
  probing_ = false;
  flat_buffers_.copy_(statistics);  // the pass is not training: BatchNorm's statistics stay as they were
  begin_micro_batch(0, 2, 0, 1);
  disarm();
  // The order seen (a parameter once, at its first report), then those the pass left without a gradient.
  std::vector<std::size_t> ready;
  std::vector<bool> seen(params_.size(), false);
  for (const std::size_t i : probe_) {
    if (!seen[i]) ready.push_back(i);
    seen[i] = true;
  }
  for (const std::size_t i : order_)
    if (!seen[i]) ready.push_back(i);
  if (ready == order_) return 0;
  if (external_ && !external_->relayout) return 0;  // its views of the state would not follow
  // Memory order: the ready order reversed, so that backward's order walks the buffer from its end.
  std::vector<Slice> fresh(params_.size());
  std::size_t offset = 0, moved = 0;
  for (std::size_t k = ready.size(); k-- > 0;) {
    const std::size_t i = ready[k];
    fresh[i] = {offset, slices_[i].count};
    offset += slices_[i].count;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) moved += fresh[i].offset != slices_[i].offset ? 1 : 0;
  move_ranges(flat_params_, slices_, fresh);
  for (const at::Tensor& t : state_tensors()) move_ranges(t, slices_, fresh);
  slices_ = std::move(fresh);
  views_.clear();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i].tensor.set_data(range_of(flat_params_, slices_[i]).view(params_[i].tensor.sizes()));
    views_.push_back({params_[i].name, "params", slices_[i].offset, shape_of(params_[i].tensor), ""});
  }
  std::sort(views_.begin(), views_.end(),
            [](const TensorView& a, const TensorView& b) { return a.offset < b.offset; });
  order_ = std::move(ready);
  begin_micro_batch(0, 2, 0, 1);  // every .grad a view of its new range
  disarm();
  if (external_) external_->relayout();
  to_host();  // on a device: the host record in the new layout
  return moved;
}

std::span<float> TorchWorkload::params() { return span_of(host_params_); }
std::span<float> TorchWorkload::grads() { return span_of(host_grads_); }

std::string TorchWorkload::optimizer_name() const {
  if (sharded_) return sharded_name_;
  if (external_) return external_->name;
  return optimizer_name_unsharded();
}

std::string TorchWorkload::optimizer_name_unsharded() const {
  return device_optimizer_ ? device_optimizer_->name() : optimizer_->name();
}

std::vector<at::Tensor> TorchWorkload::state_tensors() {
  std::vector<at::Tensor> out;
  if (sharded_) return out;  // the runtime's (train/shards.hpp)
  if (external_) {
    for (const NamedTensor& t : external_->state) out.push_back(t.tensor);
  } else if (device_optimizer_) {
    for (const auto& [name, t] : device_optimizer_->state()) out.push_back(t);
  } else {
    for (const auto& [name, span] : optimizer_->state()) out.push_back(tensor_of(span));
  }
  return out;
}

NamedSpans TorchWorkload::optimizer_state() {
  if (sharded_) return {};  // the runtime's, by shards
  if (!device_ && !external_) return optimizer_->state();
  NamedSpans out;
  std::vector<std::string> names;
  if (external_) {
    for (const NamedTensor& t : external_->state) names.push_back(t.name);
  } else {
    for (const auto& [name, t] : device_optimizer_->state()) names.push_back(name);
  }
  const std::vector<at::Tensor> tensors = device_ ? host_state_ : state_tensors();
  for (std::size_t k = 0; k < names.size(); ++k) out.emplace_back(names[k], span_of(tensors[k]));
  return out;
}

std::int64_t TorchWorkload::optimizer_steps() const {
  if (sharded_) return 0;
  if (external_) return external_->steps();
  return device_optimizer_ ? device_optimizer_->steps() : optimizer_->steps();
}

void TorchWorkload::set_optimizer_steps(std::int64_t steps) {
  if (sharded_) return;
  if (external_) {
    external_->set_steps(steps);
  } else if (device_optimizer_) {
    device_optimizer_->set_steps(steps);
  } else {
    optimizer_->set_steps(steps);
  }
}

void TorchWorkload::optimizer_step(float lr) {
  if (sharded_) SINEW_THROW(InternalError, "the workload's optimiser step, but its state is sharded");
  if (external_) {
    external_->step(lr);
  } else if (device_optimizer_) {
    device_optimizer_->step(flat_params_, flat_grads_, lr);
  } else {
    optimizer_->step(params(), grads(), lr);
  }
}

void TorchWorkload::use_optimizer(ExternalOptimizer o) {
  if (sharded_)
    SINEW_THROW(InternalError,
                "optimizer {}: a sharded state's optimiser is made per shard (use_sharded_optimizer)",
                o.name);
  if (!o.step || !o.steps || !o.set_steps)
    SINEW_THROW(InvalidArgument, "optimizer {}: its step and step-count functions are required", o.name);
  for (const NamedTensor& t : o.state) {
    if (!t.tensor.defined() || t.tensor.scalar_type() != at::kFloat ||
        t.tensor.device() != flat_params_.device() || !t.tensor.is_contiguous() ||
        t.tensor.numel() != flat_params_.numel()) {
      SINEW_THROW(
          InvalidArgument,
          "optimizer {}: its state '{}' must be a contiguous float32 tensor of the {} parameters on {}",
          o.name, t.name, flat_params_.numel(), flat_params_.device().str());
    }
  }
  external_ = std::move(o);
  // Sinew's fused optimiser is never stepped again, and it made its state when the workload was built (SGD's
  // momentum, Adam's moments: a float per parameter per key): freed, or the script's loop would carry one
  // unused copy of the parameters per key beside the adopted optimiser's own (issue 49's peak memory).
  optimizer_.reset();
  device_optimizer_.reset();
  host_state_.clear();
  if (device_)
    for (const at::Tensor& t : state_tensors()) host_state_.push_back(host_copy(t));
}

namespace {

/// One shard's range of a script's optimiser (an ExternalOptimizer over views of the range): the runtime's
/// optim::Optimizer, which steps it and reads its state by name.
class ExternalShard final : public optim::Optimizer {
 public:
  explicit ExternalShard(ExternalOptimizer o) : o_(std::move(o)) {}
  [[nodiscard]] std::string name() const override { return o_.name; }
  void step(std::span<float> /*params*/, std::span<const float> /*grads*/, float lr) override {
    o_.step(lr);  // its parameters and gradients are views of the range of the flat buffers
    ++steps_;
  }
  std::vector<std::pair<std::string, std::span<float>>> state() override {
    std::vector<std::pair<std::string, std::span<float>>> out;
    for (const NamedTensor& t : o_.state) out.emplace_back(t.name, span_of(t.tensor));
    return out;
  }
  void set_steps(std::int64_t steps) override {
    Optimizer::set_steps(steps);
    o_.set_steps(steps);
  }

 private:
  ExternalOptimizer o_;
};

}  // namespace

void TorchWorkload::shard_state() {
  if (external_) {
    SINEW_THROW(
        InvalidArgument,
        "--shard optimizer: optimizer {} was adopted with its whole state; a sharded state's optimiser is "
        "made per shard (the Python package does it); use --shard none",
        external_->name);
  }
  sharded_ = true;
  sharded_name_ = optimizer_name_unsharded();
  optimizer_.reset();  // the runtime holds the state, by shards (on a device: on the host, per shard)
  device_optimizer_.reset();
  host_state_.clear();
}

void TorchWorkload::use_sharded_optimizer(std::string name, ShardFactory make) {
  SINEW_ENFORCE(sharded_, "a sharded optimiser for a workload that does not shard its state");
  // On a GPU too: `make` builds each shard's optimiser over the host record (host_params(), host_grads()),
  // where the session steps the shards (ZeRO-Offload's placement).
  if (shards_made_) {
    // The runtime made its shards with Sinew's own optimiser already: this one would never be stepped.
    SINEW_THROW(
        InvalidArgument,
        "optimizer {}: given after training started with --shard optimizer; create it before the first "
        "step",
        name);
  }
  external_.reset();
  sharded_name_ = std::move(name);
  shard_factory_ = std::move(make);
}

std::unique_ptr<optim::Optimizer> TorchWorkload::shard_optimizer(Slice range,
                                                                 const optim::StatePlacement& place) {
  shards_made_ = true;
  if (!shard_factory_) return nullptr;
  ExternalOptimizer o = shard_factory_(range, place);
  o.name = sharded_name_;
  if (!o.step || !o.steps || !o.set_steps)
    SINEW_THROW(InvalidArgument, "optimizer {}: its shard's step and step-count functions are required",
                o.name);
  for (const NamedTensor& t : o.state) {
    if (!t.tensor.defined() || t.tensor.scalar_type() != at::kFloat || !t.tensor.device().is_cpu() ||
        !t.tensor.is_contiguous() || t.tensor.numel() != static_cast<std::int64_t>(range.count)) {
      SINEW_THROW(InvalidArgument,
                  "optimizer {}: its shard's state '{}' must be a contiguous float32 CPU tensor "
                  "of the shard's {} elements",
                  o.name, t.name, range.count);
    }
  }
  return std::make_unique<ExternalShard>(std::move(o));
}

NamedSpans TorchWorkload::buffers() {
  NamedSpans out;
  const std::span<float> all = span_of(host_buffers_);
  for (std::size_t i = 0; i < buffer_tensors_.size(); ++i)
    out.emplace_back(buffer_tensors_[i].name, buffer_slices_[i].of(all));
  return out;
}

void TorchWorkload::buffers_to_host() {
  if (device_) host_buffers_.copy_(flat_buffers_);
}

void TorchWorkload::buffers_to_device() {
  if (device_) flat_buffers_.copy_(host_buffers_);
}

float* TorchWorkload::attach_device(int index) {
  if (!device_) return Workload::attach_device(index);
  if (index != device_->index) {
    SINEW_THROW(InvalidArgument, "{}: the group chose GPU {} for this member, its model is on GPU {}", model_,
                index, device_->index);
  }
  return flat_grads_.data_ptr<float>();
}

void TorchWorkload::to_host() {
  if (!device_) return;
  host_params_.copy_(flat_params_);
  host_buffers_.copy_(flat_buffers_);
  const std::vector<at::Tensor> state = state_tensors();
  for (std::size_t k = 0; k < state.size(); ++k) host_state_[k].copy_(state[k]);
}

void TorchWorkload::grads_to_host(std::span<const Slice> ranges) {
  if (!device_) return;
  for (const Slice r : ranges) range_of(host_grads_, r).copy_(range_of(flat_grads_, r));
}

void TorchWorkload::params_to_device(std::span<const Slice> ranges) {
  if (!device_) return;
  at::NoGradGuard no_grad;
  for (const Slice r : ranges) range_of(flat_params_, r).copy_(range_of(host_params_, r));
}

std::span<float> TorchWorkload::device_params() {
  if (!device_) return {};
  return {flat_params_.data_ptr<float>(), static_cast<std::size_t>(flat_params_.numel())};
}

void TorchWorkload::to_device() {
  if (!device_) return;
  at::NoGradGuard no_grad;
  flat_params_.copy_(host_params_);
  flat_buffers_.copy_(host_buffers_);
  const std::vector<at::Tensor> state = state_tensors();
  for (std::size_t k = 0; k < state.size(); ++k) state[k].copy_(host_state_[k]);
}

void TorchWorkload::keep_buffers() {
  at::NoGradGuard no_grad;
  if (flat_buffers_.defined() && flat_buffers_.numel() > 0) {
    if (!kept_buffers_.defined()) kept_buffers_ = at::empty_like(flat_buffers_);
    kept_buffers_.copy_(flat_buffers_);
  }
  if (kept_others_.size() != others_.size()) {
    kept_others_.clear();
    for (const at::Tensor& t : others_) kept_others_.push_back(at::empty_like(t));
  }
  for (std::size_t i = 0; i < others_.size(); ++i) kept_others_[i].copy_(others_[i]);
}

void TorchWorkload::restore_buffers() {
  at::NoGradGuard no_grad;
  if (kept_buffers_.defined()) flat_buffers_.copy_(kept_buffers_);
  if (kept_others_.size() == others_.size())
    for (std::size_t i = 0; i < others_.size(); ++i) others_[i].copy_(kept_others_[i]);
}

void TorchWorkload::shard_parameters() {
  sparse_grads_ = true;
  return_large_blocks();  // autograd's temporaries of a layer's size go back to the system when freed
}

void TorchWorkload::zero_grads() {
  if (std::exchange(fresh_grads_, false)) return;
  if (sparse_grads_) {
    zero_pages(span_of(flat_grads_));  // no memory until backward writes them
  } else {
    at::NoGradGuard no_grad;
    flat_grads_.zero_();
  }
}

void TorchWorkload::begin_micro_batch(std::size_t j, std::size_t micro_batches, std::size_t samples,
                                      std::size_t total) {
  if (j == 0) {
    zero_grads();
    scale_ = 1;
  }
  // A script that set .grad to None (optimizer.zero_grad()'s default) cut the tie: restore it.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].tensor;
    if (!p.grad().defined() || p.grad().data_ptr() != flat_grads_.data_ptr<float>() + slices_[i].offset) {
      p.mutable_grad() = range_of(flat_grads_, slices_[i]).view(p.sizes());
      if (j > 0) p.mutable_grad().zero_();  // (cannot happen between micro-batches of a well-formed step)
    }
  }
  // The gradients hold sum_i s_i g_i / s_j over the micro-batches so far (s_i = samples_i / total): a
  // change of share rescales them before the next one adds its g; the last multiplies by its share.
  if (samples > 0 && total > 0) {
    const float s = static_cast<float>(static_cast<double>(samples) / static_cast<double>(total));
    if (j > 0 && s != scale_) flat_grads_.mul_(scale_ / s);
    scale_ = s;
  }
  std::fill(done_.begin(), done_.end(), false);
  reported_ = 0;
  armed_ = j + 1 == micro_batches;
}

void TorchWorkload::report(std::size_t i) {
  done_[i] = true;
  ++reported_;
  if (device_) {
    if (device_ready_) device_ready_(slices_[i], device_->events->record(i));
  } else if (ready_) {
    ready_(slices_[i]);
  }
}

void TorchWorkload::skip_micro_batch() {
  if (!armed_) return;
  for (const std::size_t i : order_) {
    if (done_[i]) continue;
    if (scale_ != 1.f) range_of(flat_grads_, slices_[i]).mul_(scale_);
    report(i);
  }
}

std::vector<std::string> TorchWorkload::unreported() const {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!done_[i]) out.push_back(params_[i].name);
  return out;
}

void TorchWorkload::on_grad(std::size_t i, const at::Tensor& param) {
  float* const mine = flat_grads_.data_ptr<float>() + slices_[i].offset;
  const at::Tensor& g = param.grad();
  if (g.defined() && g.data_ptr() != mine) {
    // Autograd did not accumulate into the view (the script replaced .grad during the step): take the value.
    at::NoGradGuard no_grad;
    range_of(flat_grads_, slices_[i]).copy_(g.reshape({-1}));
  }
  if (probing_) probe_.push_back(i);
  if (!armed_) return;
  if (done_[i]) {
    SINEW_THROW(
        InvalidArgument,
        "parameter '{}' got its gradient twice in one micro-batch: call backward() once per micro-batch "
        "(several losses: add them first)",
        params_[i].name);
  }
  if (scale_ != 1.f) {
    if (device_) {
      range_of(flat_grads_, slices_[i]).mul_(scale_);  // on the stream that wrote it (autograd's current)
    } else {
      for (float& x : std::span<float>(mine, slices_[i].count)) x *= scale_;
    }
  }
  report(i);
  if (reported_ == 1) {
    if (backward_done_) torch::autograd::Engine::get_default_engine().queue_callback(backward_done_);
    if (first_ready_) first_ready_();
  }
}

}  // namespace sinew::pytorch
