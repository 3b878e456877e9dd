#include "sinew/model/cuda/device_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "sinew/core/error.hpp"
#include "sinew/cuda/check.hpp"
#include "sinew/model/cuda/kernels.hpp"

namespace sinew::model::cuda {

namespace {

constexpr float kOne = 1.f;
constexpr float kZero = 0.f;

/// The checks that need no GPU, done before the constructor touches one.
const Model& checked(const Model& host, const optim::OptimizerOptions& opt) {
  check_supported(host);
  (void)optim::make_optimizer(opt, 0);  // the host optimiser's checks of name and options, same messages
  return host;
}

}  // namespace

void check_supported(const Model& host) {
  if (host.num_layers() == 0) SINEW_THROW(InvalidArgument, "--device cuda: the model has no layers");
  for (std::size_t i = 0; i < host.num_layers(); ++i) {
    const std::string kind = host.layer(i).kind();
    if (kind != "linear" && kind != "relu") {
      SINEW_THROW(InvalidArgument,
                  "--device cuda supports the models logreg and mlp[:H1,...]; {} runs on --device cpu only "
                  "(layer {} is a {})",
                  host.spec(), i, kind);
    }
  }
}

DeviceModel::DeviceModel(const Model& host, const optim::OptimizerOptions& opt, bool optimizer_state)
    : input_dim_(checked(host, opt).input_shape().size()),
      classes_(host.num_classes()),
      num_params_(host.num_params()),
      opt_(opt),
      adam_(opt.name == "adam"),
      blas_(stream_.get()) {
  std::size_t linear = 0;
  for (std::size_t i = 0; i < host.num_layers(); ++i) {
    const model::Layer& l = host.layer(i);
    Layer d;
    d.linear = l.kind() == "linear";
    d.in = l.input_shape().size();
    d.out = l.output_shape().size();
    d.params = host.layer_params(i);
    if (d.linear) {
      SINEW_ENFORCE_EQ(d.params.count,
                       static_cast<std::size_t>(d.out) * static_cast<std::size_t>(d.in) + d.out,
                       "linear layer {}: W (out x in), then b", i);
      d.ready = linear++;
    }
    widest_ = std::max(widest_, d.out);
    layers_.push_back(d);
  }

  const cudaStream_t s = stream_.get();
  params_ = sinew::cuda::DeviceBuffer<float>(num_params_);
  grads_ = sinew::cuda::DeviceBuffer<float>(num_params_);
  params_.upload(host.params(), s);
  grads_.zero(s);
  has_state_ = optimizer_state;
  const std::size_t state_count = !has_state_ ? 0 : adam_ ? 2 : (opt_.momentum > 0.f ? 1 : 0);
  for (std::size_t k = 0; k < state_count; ++k) {
    state_[k] = sinew::cuda::DeviceBuffer<float>(num_params_);
    state_[k].zero(s);
  }
  sums_ = sinew::cuda::DeviceBuffer<double>(2);
  result_ = sinew::cuda::PinnedBuffer<double>(2);
  ready_.reserve(linear);
  for (std::size_t k = 0; k < linear; ++k) ready_.emplace_back();
  synchronize();
}

void DeviceModel::check_batch(const std::int32_t* labels, std::size_t n, const char* what) const {
  // cuBLAS takes int sizes; the widest product has widest_ (or the input size) rows per sample.
  const auto int_max = static_cast<std::size_t>(std::numeric_limits<int>::max());
  const auto rows = static_cast<std::size_t>(std::max(widest_, input_dim_));
  if (n > int_max / rows) {
    SINEW_THROW(InvalidArgument, "{}: a batch of {} samples is too large for one device pass (at most {})",
                what, n, int_max / rows);
  }
  if (n > 0 && labels == nullptr) SINEW_THROW(InvalidArgument, "{}: {} samples but no labels", what, n);
  for (std::size_t c = 0; c < n; ++c) {
    if (labels[c] < 0 || labels[c] >= classes_) {
      SINEW_THROW(DataError,
                  "{}: label {} of sample {} is outside [0, {}): the data has more classes than the model",
                  what, labels[c], c, classes_);
    }
  }
}

void DeviceModel::reserve(std::size_t n) {
  if (n <= capacity_) return;
  // The old buffers may still be in use by queued work: let it finish before they are freed.
  synchronize();
  acts_.clear();
  acts_.emplace_back(static_cast<std::size_t>(input_dim_) * n);
  for (const Layer& l : layers_) acts_.emplace_back(static_cast<std::size_t>(l.out) * n);
  for (auto& d : dact_) d = sinew::cuda::DeviceBuffer<float>(static_cast<std::size_t>(widest_) * n);
  labels_ = sinew::cuda::DeviceBuffer<std::int32_t>(n);
  sample_loss_ = sinew::cuda::DeviceBuffer<double>(n);
  sample_correct_ = sinew::cuda::DeviceBuffer<double>(n);
  capacity_ = n;
}

void DeviceModel::forward(const float* x, const std::int32_t* labels, std::size_t n) {
  if (x == nullptr) SINEW_THROW(InvalidArgument, "DeviceModel: {} samples but no input", n);
  reserve(n);
  const cudaStream_t s = stream_.get();
  acts_[0].upload(std::span<const float>(x, static_cast<std::size_t>(input_dim_) * n), s);
  labels_.upload(std::span<const std::int32_t>(labels, n), s);
  const int cols = static_cast<int>(n);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& l = layers_[i];
    const float* in = acts_[i].data();
    float* out = acts_[i + 1].data();
    if (l.linear) {
      const float* w = params_.data() + l.params.offset;
      const float* b = w + static_cast<std::size_t>(l.out) * static_cast<std::size_t>(l.in);
      // y (out x n) = W (out x in) * x (in x n), then y += b per column, as Linear::forward.
      SINEW_CUBLAS(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, l.out, cols, l.in, &kOne, w, l.out, in,
                               l.in, &kZero, out, l.out));
      detail::launch_bias_add(out, b, l.out, n, s);
      sinew::cuda::check_last_launch("bias_add");
    } else {
      detail::launch_relu_forward(in, out, static_cast<std::size_t>(l.out) * n, s);
      sinew::cuda::check_last_launch("relu_forward");
    }
  }
}

float DeviceModel::train_batch(const float* x, const std::int32_t* labels, std::size_t n, double denominator,
                               bool accumulate, const std::function<void(Slice, cudaEvent_t)>& on_ready) {
  if (!(denominator >= 0) || !std::isfinite(denominator)) {
    SINEW_THROW(InvalidArgument, "DeviceModel::train_batch: denominator must be finite and >= 0, got {}",
                denominator);
  }
  check_batch(labels, n, "DeviceModel::train_batch");
  const cudaStream_t s = stream_.get();
  if (n == 0) {
    // No samples: the gradient is zero (or unchanged when accumulating), and every range is still
    // reported, so that the collectives of all ranks stay in step.
    if (!accumulate) grads_.zero(s);
    for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
      if (!it->linear) continue;
      sinew::cuda::Event& e = ready_[it->ready];
      e.record(s);
      if (on_ready) on_ready(it->params, e.get());
    }
    return 0.f;
  }
  const double denom = denominator > 0 ? denominator : static_cast<double>(n);
  forward(x, labels, n);

  const std::size_t last = layers_.size();
  const int cols = static_cast<int>(n);
  float* dlogits = dact_[last % 2].data();  // backward below never writes this buffer before reading it
  detail::launch_softmax_xent(acts_[last].data(), labels_.data(), classes_, n,
                              static_cast<float>(1.0 / denom), dlogits, sample_loss_.data(), s);
  sinew::cuda::check_last_launch("softmax_xent");
  detail::launch_sum(sample_loss_.data(), n, sums_.data(), s);
  sinew::cuda::check_last_launch("sum");

  const float beta = accumulate ? 1.f : 0.f;
  const float* dy = dlogits;
  for (std::size_t i = last; i-- > 0;) {
    const Layer& l = layers_[i];
    const float* in = acts_[i].data();
    if (l.linear) {
      float* dw = grads_.data() + l.params.offset;
      float* db = dw + static_cast<std::size_t>(l.out) * static_cast<std::size_t>(l.in);
      // dW (out x in) (+)= dy (out x n) * x^T; db (+)= row sums of dy: Linear::backward_params.
      SINEW_CUBLAS(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, l.out, l.in, cols, &kOne, dy, l.out, in,
                               l.in, &beta, dw, l.out));
      detail::launch_bias_grad(dy, l.out, n, db, accumulate, s);
      sinew::cuda::check_last_launch("bias_grad");
      // This range is final: nothing below writes it again, so its reduction may start now.
      sinew::cuda::Event& e = ready_[l.ready];
      e.record(s);
      if (on_ready) on_ready(l.params, e.get());
    }
    if (i == 0) break;                // the gradient with respect to the model input is never needed
    float* dx = dact_[i % 2].data();  // never the buffer dy lives in: that is dact_[(i + 1) % 2]
    if (l.linear) {
      const float* w = params_.data() + l.params.offset;
      // dx (in x n) = W^T (in x out) * dy (out x n): Linear::backward_input.
      SINEW_CUBLAS(cublasSgemm(blas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, l.in, cols, l.out, &kOne, w, l.out, dy,
                               l.out, &kZero, dx, l.in));
    } else {
      detail::launch_relu_backward(acts_[i + 1].data(), dy, dx, static_cast<std::size_t>(l.out) * n, s);
      sinew::cuda::check_last_launch("relu_backward");
    }
    dy = dx;
  }

  SINEW_CUDA(cudaMemcpyAsync(result_.data(), sums_.data(), sizeof(double), cudaMemcpyDeviceToHost, s));
  synchronize();
  return static_cast<float>(result_[0] / denom);
}

void DeviceModel::zero_grads() { grads_.zero(stream_.get()); }

std::pair<double, std::size_t> DeviceModel::evaluate(const float* x, const std::int32_t* labels,
                                                     std::size_t n) {
  check_batch(labels, n, "DeviceModel::evaluate");
  if (n == 0) return {0.0, 0};
  forward(x, labels, n);
  const cudaStream_t s = stream_.get();
  detail::launch_loss_and_correct(acts_.back().data(), labels_.data(), classes_, n, sample_loss_.data(),
                                  sample_correct_.data(), s);
  sinew::cuda::check_last_launch("loss_and_correct");
  detail::launch_sum(sample_loss_.data(), n, sums_.data(), s);
  sinew::cuda::check_last_launch("sum");
  detail::launch_sum(sample_correct_.data(), n, sums_.data() + 1, s);
  sinew::cuda::check_last_launch("sum");
  SINEW_CUDA(cudaMemcpyAsync(result_.data(), sums_.data(), 2 * sizeof(double), cudaMemcpyDeviceToHost, s));
  synchronize();
  // The count is a sum of 0s and 1s in double: exact below 2^53 samples.
  return {result_[0], static_cast<std::size_t>(result_[1])};
}

void DeviceModel::optimizer_step(float lr) {
  SINEW_ENFORCE(has_state_,
                "a device optimiser step of a model whose optimiser state is sharded on the host");
  if (!(lr >= 0) || !std::isfinite(lr)) {
    SINEW_THROW(InvalidArgument, "optimizer '{}': learning rate must be finite and >= 0, got {}", opt_.name,
                lr);
  }
  const cudaStream_t s = stream_.get();
  const std::int64_t t = steps_ + 1;
  if (adam_) {
    // Bias corrections in double, exactly as optim::Adam::step computes them.
    const double bc1 = 1.0 - std::pow(static_cast<double>(opt_.beta1), static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(static_cast<double>(opt_.beta2), static_cast<double>(t));
    const auto step_size = static_cast<float>(static_cast<double>(lr) / bc1);
    const auto bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    detail::launch_adam(params_.data(), grads_.data(), state_[0].data(), state_[1].data(), num_params_,
                        step_size, bc2_sqrt, opt_.beta1, opt_.beta2, opt_.eps, opt_.weight_decay, s);
    sinew::cuda::check_last_launch("adam");
  } else {
    const int variant = opt_.momentum == 0.f ? 0 : (opt_.nesterov ? 2 : 1);
    detail::launch_sgd(params_.data(), grads_.data(), state_[0].data(), num_params_, lr, opt_.momentum,
                       opt_.weight_decay, variant, s);
    sinew::cuda::check_last_launch("sgd");
  }
  steps_ = t;
}

std::vector<std::pair<const char*, sinew::cuda::DeviceBuffer<float>*>> DeviceModel::state_buffers() {
  if (adam_) return {{"adam_m", &state_[0]}, {"adam_v", &state_[1]}};
  if (opt_.momentum > 0.f) return {{"momentum", &state_[0]}};
  return {};
}

void DeviceModel::check_host(const Model& host, optim::Optimizer& opt, const char* what) {
  SINEW_ENFORCE(has_state_, "DeviceModel::{} of the optimiser state, but it is sharded on the host", what);
  if (host.num_params() != num_params_) {
    SINEW_THROW(InvalidArgument, "DeviceModel::{}: the host model has {} parameters, the device model {}",
                what, host.num_params(), num_params_);
  }
  const auto mine = state_buffers();
  const auto theirs = opt.state();
  bool same = opt_.name == opt.name() && mine.size() == theirs.size();
  for (std::size_t k = 0; same && k < mine.size(); ++k) {
    same = theirs[k].first == mine[k].first && theirs[k].second.size() == num_params_;
  }
  if (!same) {
    SINEW_THROW(
        InvalidArgument,
        "DeviceModel::{}: the host optimiser '{}' with {} state buffers does not match the device's '{}' "
        "with {}",
        what, opt.name(), theirs.size(), opt_.name, mine.size());
  }
}

void DeviceModel::download(Model& host, optim::Optimizer& opt) {
  check_host(host, opt, "download");
  const cudaStream_t s = stream_.get();
  params_.download(host.params(), s);
  const auto mine = state_buffers();
  const auto theirs = opt.state();
  for (std::size_t k = 0; k < mine.size(); ++k) mine[k].second->download(theirs[k].second, s);
  synchronize();
  opt.set_steps(steps_);
}

void DeviceModel::upload(const Model& host, const optim::Optimizer& opt) {
  // state() is not const (its spans write through); reading it changes nothing.
  auto& writable = const_cast<optim::Optimizer&>(opt);
  check_host(host, writable, "upload");
  const cudaStream_t s = stream_.get();
  params_.upload(host.params(), s);
  const auto mine = state_buffers();
  const auto theirs = writable.state();
  for (std::size_t k = 0; k < mine.size(); ++k) mine[k].second->upload(theirs[k].second, s);
  synchronize();
  steps_ = opt.steps();
}

void DeviceModel::download_params(std::span<float> out, std::size_t offset) {
  params_.download(out, stream_.get(), offset);
  synchronize();
}

void DeviceModel::download_grads(std::span<float> out, std::size_t offset) {
  grads_.download(out, stream_.get(), offset);
  synchronize();
}

void DeviceModel::upload_params(std::span<const float> in, std::size_t offset) {
  params_.upload(in, stream_.get(), offset);
  synchronize();
}

void DeviceModel::synchronize() { stream_.synchronize(); }

}  // namespace sinew::model::cuda
