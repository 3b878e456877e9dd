#include "sinew/torch/workload.hpp"

#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <utility>

#include "sinew/core/error.hpp"

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
  if (!t.device().is_cpu()) {
    SINEW_THROW(InvalidArgument,
                "parameter '{}' is on {}: this build of Sinew's PyTorch integration trains CPU tensors "
                "(docs/pytorch.md); move the model with .cpu() before wrapping it",
                p.name, t.device().str());
  }
}

/// Copies the tensors' values into one new flat float buffer and makes each tensor a view of its range.
at::Tensor flatten(std::vector<NamedTensor>& tensors, std::vector<Slice>& slices) {
  std::size_t n = 0;
  for (const NamedTensor& t : tensors) {
    slices.push_back({n, static_cast<std::size_t>(t.tensor.numel())});
    n += slices.back().count;
  }
  at::Tensor flat = at::empty({static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kFloat));
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
  }
  return flat;
}

std::span<float> span_of(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return {};
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

/// Moves range from[i] of `flat` to range to[i], for every i (a permutation of equal-sized ranges).
void move_ranges(std::span<float> flat, const std::vector<Slice>& from, const std::vector<Slice>& to) {
  const std::vector<float> old(flat.begin(), flat.end());
  for (std::size_t i = 0; i < from.size(); ++i) {
    const auto src = from[i].of(std::span<const float>(old));
    std::copy(src.begin(), src.end(), to[i].of(flat).begin());
  }
}

}  // namespace

TorchWorkload::TorchWorkload(std::vector<NamedTensor> params, std::vector<NamedTensor> buffers,
                             const optim::OptimizerOptions& optimizer, std::string model)
    : params_(std::move(params)), buffer_tensors_(std::move(buffers)), model_(std::move(model)) {
  if (params_.empty()) SINEW_THROW(InvalidArgument, "{} has no parameters that require a gradient", model_);
  for (const NamedTensor& p : params_) check_parameter(p);
  for (const NamedTensor& b : buffer_tensors_) {
    if (b.tensor.scalar_type() != at::kFloat || !b.tensor.device().is_cpu())
      SINEW_THROW(InvalidArgument, "buffer '{}' must be a float32 CPU tensor (it is {} on {})", b.name,
                  c10::toString(b.tensor.scalar_type()), b.tensor.device().str());
  }
  flat_params_ = flatten(params_, slices_);
  flat_buffers_ = flatten(buffer_tensors_, buffer_slices_);
  flat_grads_ = at::zeros_like(flat_params_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    views_.push_back({params_[i].name, "params", slices_[i].offset, shape_of(params_[i].tensor), ""});
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i].tensor, std::make_unique<ReadyHook>(*this, i));
  }
  for (std::size_t i = params_.size(); i-- > 0;) order_.push_back(i);  // the module's order, reversed
  done_.assign(params_.size(), false);
  optimizer_ = optim::make_optimizer(optimizer, static_cast<std::size_t>(flat_params_.numel()));
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
  return fmt::format("{} ({} parameters in {} tensors)", model_, flat_params_.numel(), params_.size());
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
  move_ranges(params(), slices_, fresh);
  for (const auto& [name, span] : optimizer_state()) move_ranges(span, slices_, fresh);
  slices_ = std::move(fresh);
  views_.clear();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i].tensor.set_data(flat_params_
                                   .narrow(0, static_cast<std::int64_t>(slices_[i].offset),
                                           static_cast<std::int64_t>(slices_[i].count))
                                   .view(params_[i].tensor.sizes()));
    views_.push_back({params_[i].name, "params", slices_[i].offset, shape_of(params_[i].tensor), ""});
  }
  std::sort(views_.begin(), views_.end(),
            [](const TensorView& a, const TensorView& b) { return a.offset < b.offset; });
  order_ = std::move(ready);
  begin_micro_batch(0, 2, 0, 1);  // every .grad a view of its new range
  disarm();
  if (external_) external_->relayout();
  return moved;
}

std::span<float> TorchWorkload::params() { return span_of(flat_params_); }
std::span<float> TorchWorkload::grads() { return span_of(flat_grads_); }

std::string TorchWorkload::optimizer_name() const { return external_ ? external_->name : optimizer_->name(); }

NamedSpans TorchWorkload::optimizer_state() {
  if (!external_) return optimizer_->state();
  NamedSpans out;
  for (const NamedTensor& t : external_->state) out.emplace_back(t.name, span_of(t.tensor));
  return out;
}

std::int64_t TorchWorkload::optimizer_steps() const {
  return external_ ? external_->steps() : optimizer_->steps();
}

void TorchWorkload::set_optimizer_steps(std::int64_t steps) {
  if (external_) {
    external_->set_steps(steps);
  } else {
    optimizer_->set_steps(steps);
  }
}

void TorchWorkload::optimizer_step(float lr) {
  if (external_) {
    external_->step(lr);
  } else {
    optimizer_->step(params(), grads(), lr);
  }
}

void TorchWorkload::use_optimizer(ExternalOptimizer o) {
  if (!o.step || !o.steps || !o.set_steps)
    SINEW_THROW(InvalidArgument, "optimizer {}: its step and step-count functions are required", o.name);
  for (const NamedTensor& t : o.state) {
    if (!t.tensor.defined() || t.tensor.scalar_type() != at::kFloat || !t.tensor.device().is_cpu() ||
        !t.tensor.is_contiguous() || t.tensor.numel() != flat_params_.numel()) {
      SINEW_THROW(InvalidArgument,
                  "optimizer {}: its state '{}' must be a contiguous float32 CPU tensor of the {} parameters",
                  o.name, t.name, flat_params_.numel());
    }
  }
  external_ = std::move(o);
}

NamedSpans TorchWorkload::buffers() {
  NamedSpans out;
  const std::span<float> all = span_of(flat_buffers_);
  for (std::size_t i = 0; i < buffer_tensors_.size(); ++i)
    out.emplace_back(buffer_tensors_[i].name, buffer_slices_[i].of(all));
  return out;
}

void TorchWorkload::begin_micro_batch(std::size_t j, std::size_t micro_batches, std::size_t samples,
                                      std::size_t total) {
  if (j == 0) {
    flat_grads_.zero_();
    scale_ = 1;
  }
  // A script that set .grad to None (optimizer.zero_grad()'s default) cut the tie: restore it.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].tensor;
    if (!p.grad().defined() || p.grad().data_ptr() != flat_grads_.data_ptr<float>() + slices_[i].offset) {
      p.mutable_grad() = flat_grads_
                             .narrow(0, static_cast<std::int64_t>(slices_[i].offset),
                                     static_cast<std::int64_t>(slices_[i].count))
                             .view(p.sizes());
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

void TorchWorkload::skip_micro_batch() {
  if (!armed_) return;
  const std::span<float> g = grads();
  for (std::size_t i = params_.size(); i-- > 0;) {  // in ready order
    if (done_[i]) continue;
    for (float& x : slices_[i].of(g)) x *= scale_;
    done_[i] = true;
    ++reported_;
    if (ready_) ready_(slices_[i]);
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
    flat_grads_
        .narrow(0, static_cast<std::int64_t>(slices_[i].offset), static_cast<std::int64_t>(slices_[i].count))
        .copy_(g.reshape({-1}));
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
    for (float& x : std::span<float>(mine, slices_[i].count)) x *= scale_;
  }
  done_[i] = true;
  ++reported_;
  if (ready_) ready_(slices_[i]);
  if (reported_ == 1 && first_ready_) first_ready_();
}

}  // namespace sinew::pytorch
