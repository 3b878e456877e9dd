// The model on a GPU: a mirror of a host model::Model made of Linear and ReLU layers ("logreg", "mlp",
// "mlp:H1,..."), with the same flat parameter layout, so that the host's ranges (layer_params,
// grad_ready_order), checkpoints and collectives apply unchanged to the device buffers.
//
// Everything runs on one stream, stream(): uploads, cuBLAS products (FP32, CUBLAS_PEDANTIC_MATH: no TF32),
// Sinew's kernels (bias, ReLU, softmax cross-entropy, the fused optimisers; model/cuda/kernels.cu).
//
// Agreement with the CPU model (what tests/cuda checks; both sides compute in float, in other orders):
//   * loss of a batch: relative 1e-5;
//   * gradients after one batch of an MLP: |gpu - cpu| <= 1e-4 * |cpu| + 1e-5 * max|cpu| per element;
//   * parameters after 5 steps of SGD (momentum, Nesterov, weight decay) or Adam from the same gradients:
//     |gpu - cpu| <= 1e-5 * |cpu| + 1e-6 per element (the only differences are fused multiply-adds);
//   * evaluate(): the loss sum to relative 1e-5, the number correct exactly unless two logits of a sample
//     tie to within float rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "sinew/cuda/blas.hpp"
#include "sinew/cuda/buffer.hpp"
#include "sinew/cuda/event.hpp"
#include "sinew/cuda/stream.hpp"
#include "sinew/model/model.hpp"
#include "sinew/optim/optimizer.hpp"

namespace sinew::model::cuda {

/// Throws InvalidArgument unless every layer of `host` is a Linear or a ReLU: "--device cuda supports the
/// models logreg and mlp[:H1,...]; cnn runs on --device cpu only". Needs no GPU.
void check_supported(const Model& host);

class DeviceModel {
 public:
  /// Copies host's parameters to the current device (cudaSetDevice first); gradients start at zero, the
  /// optimiser state at zero and steps() at 0 (upload() restores a trained state). Throws InvalidArgument
  /// for unsupported layers or optimiser options (the checks of optim::make_optimizer), CudaError if the
  /// GPU fails.
  /// `optimizer_state` false: a sharded optimiser state (--shard optimizer|gradients) is the runtime's, on
  /// the host (train/shards.hpp): the device holds no state, and optimizer_step(), download() and upload()
  /// are refused (the parameters and gradients move with the copies below).
  DeviceModel(const Model& host, const optim::OptimizerOptions& opt, bool optimizer_state = true);
  DeviceModel(const DeviceModel&) = delete;
  DeviceModel& operator=(const DeviceModel&) = delete;
  DeviceModel(DeviceModel&&) = delete;  // the ready events and the cuBLAS handle refer to stream_
  DeviceModel& operator=(DeviceModel&&) = delete;
  ~DeviceModel() = default;

  [[nodiscard]] std::size_t num_params() const { return num_params_; }
  /// Device pointers to the flat parameters and gradients (the host model's layout).
  [[nodiscard]] float* params() { return params_.data(); }
  [[nodiscard]] float* grads() { return grads_.data(); }
  /// The compute stream everything below runs on.
  [[nodiscard]] cudaStream_t stream() const { return stream_.get(); }

  /// One micro-batch. x: HOST memory, column-major input_dim x n (one column per sample, as
  /// data::Dataset::gather writes it); labels: host, n entries in [0, classes). Uploads, forward, softmax
  /// cross-entropy divided by `denominator` (the step's GLOBAL sample count; <= 0 means n: the contract of
  /// model::softmax_cross_entropy), backward. accumulate=false overwrites grads(), true adds to them.
  /// If on_ready is set, calls it once per layer with parameters, last layer first (the order and ranges of
  /// host grad_ready_order()), right after that layer's gradient kernels were enqueued, with an event
  /// recorded on stream() after them: another stream may wait for it (cudaStreamWaitEvent) and then read
  /// that range of grads(). The event stays valid, and is not re-recorded, until the next train_batch.
  /// Returns the loss sum / denominator: the call synchronises stream() once, at the end, for that scalar.
  /// n == 0 contributes nothing (grads() zeroed unless accumulate) and still reports every range.
  /// Throws InvalidArgument for a bad denominator, DataError for a label outside [0, classes).
  float train_batch(const float* x, const std::int32_t* labels, std::size_t n, double denominator,
                    bool accumulate, const std::function<void(Slice, cudaEvent_t)>& on_ready = {});

  /// Zeroes grads() on stream() (a rank with an empty batch in the epoch's last step contributes zeros).
  void zero_grads();

  /// A test-set chunk (x and labels on the host, as train_batch): returns {sum of the per-sample losses,
  /// number of samples whose argmax (first maximum on ties) is the label}. Synchronises stream().
  std::pair<double, std::size_t> evaluate(const float* x, const std::int32_t* labels, std::size_t n);

  /// One fused optimiser step over the flat buffers on stream() (one kernel), with the semantics of
  /// optim::Sgd / optim::Adam (Adam's bias correction from steps()). Increments steps(). Throws
  /// InvalidArgument for a negative or non-finite lr. Does not synchronise.
  void optimizer_step(float lr);
  [[nodiscard]] std::int64_t steps() const { return steps_; }

  /// Synchronous copies of the training state: parameters into host.params(), the optimiser state into
  /// opt.state() (same names and order: "momentum", or "adam_m" and "adam_v") and steps() into
  /// opt.set_steps(). Throws InvalidArgument if host or opt do not match this model (sizes, optimiser name).
  void download(Model& host, optim::Optimizer& opt);
  /// The reverse: host.params(), opt.state() and opt.steps() to the device.
  void upload(const Model& host, const optim::Optimizer& opt);

  /// Synchronous copies of the parameters or gradients alone: elements [offset, offset + out.size()).
  void download_params(std::span<float> out, std::size_t offset = 0);
  void download_grads(std::span<float> out, std::size_t offset = 0);
  /// The parameters' elements [offset, offset + in.size()) from the host, synchronously.
  void upload_params(std::span<const float> in, std::size_t offset = 0);
  /// Whether it holds the optimiser's state (the constructor's `optimizer_state`).
  [[nodiscard]] bool has_optimizer_state() const noexcept { return has_state_; }

  /// Waits for all work on stream(); throws CudaError if some of it failed.
  void synchronize();

 private:
  struct Layer {
    bool linear = false;    // else ReLU
    int in = 0, out = 0;    // input and output sizes of one sample
    Slice params;           // count 0 for ReLU
    std::size_t ready = 0;  // linear: its event in ready_
  };

  /// Labels in range and the batch small enough for cuBLAS' int sizes; throws otherwise.
  void check_batch(const std::int32_t* labels, std::size_t n, const char* what) const;
  /// Activation buffers for batches of up to n samples.
  void reserve(std::size_t n);
  /// Uploads x and labels and runs the forward pass; the logits end in acts_.back().
  void forward(const float* x, const std::int32_t* labels, std::size_t n);
  /// Optimiser state buffers as the host optimiser names them.
  [[nodiscard]] std::vector<std::pair<const char*, sinew::cuda::DeviceBuffer<float>*>> state_buffers();
  /// Throws InvalidArgument unless host and opt have this model's sizes and optimiser.
  void check_host(const Model& host, optim::Optimizer& opt, const char* what);

  std::vector<Layer> layers_;
  int input_dim_ = 0;
  int classes_ = 0;
  int widest_ = 0;  // the largest activation size of one sample after the input (dact_ per sample)
  std::size_t num_params_ = 0;
  optim::OptimizerOptions opt_;
  bool adam_ = false;
  std::int64_t steps_ = 0;
  bool has_state_ = true;

  sinew::cuda::Stream stream_;
  sinew::cuda::Blas blas_;
  sinew::cuda::DeviceBuffer<float> params_;
  sinew::cuda::DeviceBuffer<float> grads_;
  sinew::cuda::DeviceBuffer<float> state_[2];           // sgd: momentum (if any); adam: m, v
  std::size_t capacity_ = 0;                            // samples the buffers below hold
  std::vector<sinew::cuda::DeviceBuffer<float>> acts_;  // [0] the input, [i + 1] layer i's output
  sinew::cuda::DeviceBuffer<float> dact_[2];            // ping-pong d(loss)/d(activation)
  sinew::cuda::DeviceBuffer<std::int32_t> labels_;
  sinew::cuda::DeviceBuffer<double> sample_loss_;
  sinew::cuda::DeviceBuffer<double> sample_correct_;
  sinew::cuda::DeviceBuffer<double> sums_;    // {loss sum, correct count}
  sinew::cuda::PinnedBuffer<double> result_;  // sums_ read back
  std::vector<sinew::cuda::Event> ready_;     // one per Linear
};

}  // namespace sinew::model::cuda
