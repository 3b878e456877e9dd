// Layers of a Sinew model and the portable random number generator that initialises them.
//
// A layer owns no parameters: the Model keeps all of them in one flat buffer and hands each layer the
// span of its own parameters (and gradients) on every call. Layers therefore hold no pointers into
// model memory and a Model can be moved freely.
//
// Data layout: every activation is a column-major Matrix with ONE COLUMN PER SAMPLE. A sample of shape
// (C, H, W) is stored channel-major: element (c, y, x) sits at row c*H*W + y*W + x.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinew/core/flat.hpp"

namespace sinew::model {

/// Activations, gradients and logits: column-major, one column per sample.
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;

/// Shape of one sample.
struct Shape {
  int channels = 1, height = 1, width = 1;
  [[nodiscard]] int size() const { return channels * height * width; }
  friend bool operator==(const Shape&, const Shape&) = default;
};

/// A layer's integer hyper-parameters by name ("kernel", "padding", "stride"), in a fixed order.
using HyperParams = std::vector<std::pair<std::string, int>>;

/// splitmix64: tiny, fast, and bit-for-bit identical on every platform and standard library (unlike
/// std::uniform_real_distribution), so a seed names the same initial model everywhere.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  /// Uniform in the open interval (-bound, bound). Exact arithmetic up to one rounding to float, so the
  /// result does not depend on FMA contraction or the math library.
  float symmetric(double bound) {
    const auto k = static_cast<double>(next() >> 40);            // 24 random bits
    const double t = (2.0 * k + 1.0 - 16777216.0) / 16777216.0;  // in (-1, 1), exact in double
    return static_cast<float>(bound * t);
  }

 private:
  std::uint64_t state_;
};

/// A layer: a function of its input and (optionally) its parameters.
///
/// The Model calls, per batch: forward(); then, in reverse layer order, backward_params() (only for
/// layers with parameters) followed by backward_input() (skipped for the first layer). `x` and `y` passed
/// to the backward functions are exactly the input and output of the preceding forward().
class Layer {
 public:
  explicit Layer(const Shape& input) : input_(input), output_(input) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = default;  // for clone()
  Layer& operator=(const Layer&) = delete;
  Layer(Layer&&) = delete;  // layers live behind unique_ptr and never move
  Layer& operator=(Layer&&) = delete;

  /// Short type name, e.g. "linear".
  [[nodiscard]] virtual std::string kind() const = 0;
  /// One line for Model::summary(): kind and hyper-parameters.
  [[nodiscard]] virtual std::string describe() const { return kind(); }
  [[nodiscard]] virtual std::size_t num_params() const { return 0; }
  [[nodiscard]] virtual std::unique_ptr<Layer> clone() const = 0;
  /// The layer's parameters as named arrays, covering [0, num_params()) in order (empty without
  /// parameters). The offsets are relative to the layer's own parameters.
  [[nodiscard]] virtual std::vector<TensorView> param_views() const { return {}; }
  /// Hyper-parameters that input and output shapes do not tell (for readers outside Sinew).
  [[nodiscard]] virtual HyperParams hyper_params() const { return {}; }

  /// Deterministic initialisation of this layer's parameters (params.size() == num_params()).
  virtual void init_params(std::span<float> /*params*/, Rng& /*rng*/) const {}
  /// y = f(x; params). x: input_shape().size() x batch; y is resized to output_shape().size() x batch.
  virtual void forward(const Matrix& x, std::span<const float> params, Matrix& y) = 0;
  /// Writes d(loss)/d(params) into grads, adding to what is there if `accumulate`.
  virtual void backward_params(const Matrix& /*x*/, const Matrix& /*y*/, const Matrix& /*dy*/,
                               std::span<float> /*grads*/, bool /*accumulate*/) {}
  /// dx = d(loss)/d(x); dx is resized to match x.
  virtual void backward_input(const Matrix& x, const Matrix& y, const Matrix& dy,
                              std::span<const float> params, Matrix& dx) = 0;

  [[nodiscard]] const Shape& input_shape() const { return input_; }
  [[nodiscard]] const Shape& output_shape() const { return output_; }

 protected:
  Shape input_;
  Shape output_;
};

/// Fully connected: y = W x + b. Flat parameters: W (out x in, column-major), then b (out).
/// Treats its input as a flat vector (an implicit Flatten). Init: PyTorch's nn.Linear default,
/// W and b ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear final : public Layer {
 public:
  Linear(const Shape& input, int out_features);
  [[nodiscard]] std::string kind() const override { return "linear"; }
  [[nodiscard]] std::string describe() const override;
  [[nodiscard]] std::size_t num_params() const override;
  [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Linear>(*this); }
  /// weight: (in, out), the elements of W column-major, i.e. W^T in C order; bias: (out).
  [[nodiscard]] std::vector<TensorView> param_views() const override;
  void init_params(std::span<float> params, Rng& rng) const override;
  void forward(const Matrix& x, std::span<const float> params, Matrix& y) override;
  void backward_params(const Matrix& x, const Matrix& y, const Matrix& dy, std::span<float> grads,
                       bool accumulate) override;
  void backward_input(const Matrix& x, const Matrix& y, const Matrix& dy, std::span<const float> params,
                      Matrix& dx) override;

 private:
  int in_;
  int out_;
};

/// 2-d convolution, stride 1, zero padding `padding`, square kernel. Flat parameters: W (out_channels x
/// in_channels*k*k, column-major; column index (ci*k + ky)*k + kx), then b (out_channels).
/// Implemented as im2col + GEMM over chunks of samples (one GEMM per chunk, big enough to run near peak,
/// small enough to keep the scratch in cache). Init: PyTorch's nn.Conv2d default, U(+-1/sqrt(fan_in)).
class Conv2d final : public Layer {
 public:
  Conv2d(const Shape& input, int out_channels, int kernel, int padding);
  [[nodiscard]] std::string kind() const override { return "conv2d"; }
  [[nodiscard]] std::string describe() const override;
  [[nodiscard]] std::size_t num_params() const override;
  [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<Conv2d>(*this); }
  /// weight: (in_channels, k, k, out_channels) in C order (W's column-major elements); bias: (out).
  [[nodiscard]] std::vector<TensorView> param_views() const override;
  /// kernel, padding, stride (1).
  [[nodiscard]] HyperParams hyper_params() const override;
  void init_params(std::span<float> params, Rng& rng) const override;
  void forward(const Matrix& x, std::span<const float> params, Matrix& y) override;
  void backward_params(const Matrix& x, const Matrix& y, const Matrix& dy, std::span<float> grads,
                       bool accumulate) override;
  void backward_input(const Matrix& x, const Matrix& y, const Matrix& dy, std::span<const float> params,
                      Matrix& dx) override;

 private:
  /// Samples per GEMM for a batch of `batch`.
  [[nodiscard]] Eigen::Index chunk_size(Eigen::Index batch) const;
  /// Writes the patches of one sample as a (out_h*out_w) x (in_channels*k*k) block of a column-major matrix
  /// with leading dimension ld, starting at col: entry (p, j) is the input under kernel element j when the
  /// kernel sits at output position p, or 0 in the padding.
  void im2col(const float* sample, float* col, Eigen::Index ld) const;
  /// The adjoint of im2col: scatter-adds such a block into one sample of dx.
  void col2im(const float* col, Eigen::Index ld, float* sample) const;
  /// The output columns [lo, hi) whose kernel column kx falls inside the input (not in the padding).
  [[nodiscard]] std::pair<int, int> valid_columns(int kx) const;

  int kernel_;
  int padding_;
  // Scratch, reused across calls: patches, their gradients, and outputs (or output gradients) of one chunk
  // with the chunk's samples stacked vertically.
  std::vector<float> col_;
  std::vector<float> out_;
};

/// Max pooling, 2x2 window, stride 2 (odd trailing rows/columns are dropped, as in PyTorch). The
/// gradient flows to the first maximum of each window.
class MaxPool2d final : public Layer {
 public:
  explicit MaxPool2d(const Shape& input);
  [[nodiscard]] std::string kind() const override { return "maxpool2d"; }
  [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<MaxPool2d>(*this); }
  /// kernel 2, stride 2.
  [[nodiscard]] HyperParams hyper_params() const override { return {{"kernel", 2}, {"stride", 2}}; }
  void forward(const Matrix& x, std::span<const float> params, Matrix& y) override;
  void backward_input(const Matrix& x, const Matrix& y, const Matrix& dy, std::span<const float> params,
                      Matrix& dx) override;

 private:
  /// For each output element, the row of x (within its column) that held the maximum.
  Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic> argmax_;
};

/// y = max(x, 0); the gradient at 0 is 0.
class ReLU final : public Layer {
 public:
  using Layer::Layer;
  [[nodiscard]] std::string kind() const override { return "relu"; }
  [[nodiscard]] std::unique_ptr<Layer> clone() const override { return std::make_unique<ReLU>(*this); }
  void forward(const Matrix& x, std::span<const float> params, Matrix& y) override;
  void backward_input(const Matrix& x, const Matrix& y, const Matrix& dy, std::span<const float> params,
                      Matrix& dx) override;
};

}  // namespace sinew::model
