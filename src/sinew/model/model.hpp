// A feed-forward classifier whose parameters and gradients each live in ONE flat, contiguous float
// buffer, so that data-parallel training can reduce them in place, in bucket-sized ranges, while
// backward() is still running.
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sinew/model/layers.hpp"

namespace sinew::model {

class Model {
 public:
  /// The model specs build() accepts, for messages and --help texts.
  static constexpr const char* kValidSpecs = "logreg, mlp, mlp:H1[,H2...] (hidden sizes), cnn";

  /// Builds a model by name:
  ///   "logreg"           one linear layer
  ///   "mlp"              linear 512, relu, linear 512, relu, linear classes (same as "mlp:512,512")
  ///   "mlp:H1,H2,..."    hidden layers of the given sizes, each followed by relu
  ///   "cnn"              conv 3x3 (pad 1) 16ch, relu, maxpool 2, conv 3x3 (pad 1) 32ch, relu, maxpool 2,
  ///                      linear 128, relu, linear classes; needs height and width >= 4
  /// Parameters are initialised from `seed` identically on every platform.
  /// Throws InvalidArgument for an unknown spec, bad numbers, or an unusable input shape / class count.
  static Model build(const std::string& spec, const Shape& input, int num_classes, std::uint64_t seed);

  /// Assembles a model from layers (each layer's input shape must equal the previous layer's output
  /// shape; the last output size is the number of classes) and initialises it from `seed`.
  static Model from_layers(std::vector<std::unique_ptr<Layer>> layers, std::uint64_t seed,
                           std::string spec = "custom");

  /// An empty model (no layers); only useful as the target of a move assignment.
  Model() = default;
  // Moves keep the flat buffers where they are (std::vector moves its storage), so spans taken from
  // params()/grads() stay valid across a move. Copies must be explicit: clone().
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model() = default;

  /// A deep copy with its own buffers (parameters and gradients copied).
  [[nodiscard]] Model clone() const;

  [[nodiscard]] std::size_t num_params() const { return params_.size(); }
  /// All parameters, one contiguous buffer that is never reallocated after build().
  [[nodiscard]] std::span<float> params() { return params_; }
  [[nodiscard]] std::span<const float> params() const { return params_; }
  /// All parameter gradients, same layout as params().
  [[nodiscard]] std::span<float> grads() { return grads_; }
  [[nodiscard]] std::span<const float> grads() const { return grads_; }

  /// x: input_shape().size() x batch. Returns the logits, num_classes() x batch; the reference stays valid
  /// (and its contents unchanged) until the next forward(). The input is copied, so `x` may die after the
  /// call.
  const Matrix& forward(const Eigen::Ref<const Matrix>& x);

  /// Back-propagates d(loss)/d(logits) of the last forward(). Writes the parameter gradients into grads()
  /// (overwriting them, or adding to them if `accumulate`). For each layer with parameters, in reverse layer
  /// order, calls on_grad_ready(range) as soon as that range of grads() is final: backward() never touches
  /// it again, so another thread may reduce it in place while backward() goes on with earlier layers.
  void backward(const Matrix& dlogits, const std::function<void(Slice)>& on_grad_ready = {},
                bool accumulate = false);

  /// The ranges in the order backward() reports them (last layer first). Together they cover
  /// [0, num_params()) exactly once; layer i's parameters lie before layer i+1's in the flat buffer.
  [[nodiscard]] std::vector<Slice> grad_ready_order() const;

  /// One line per layer with shapes and parameter counts, then the total.
  [[nodiscard]] std::string summary() const;

  [[nodiscard]] const Shape& input_shape() const { return input_; }
  [[nodiscard]] int num_classes() const { return num_classes_; }
  [[nodiscard]] const std::string& spec() const { return spec_; }
  [[nodiscard]] std::size_t num_layers() const { return layers_.size(); }
  [[nodiscard]] const Layer& layer(std::size_t i) const { return *layers_.at(i); }
  /// Where layer i's parameters lie in the flat buffer (count 0 for layers without parameters).
  [[nodiscard]] Slice layer_params(std::size_t i) const { return ranges_.at(i); }

  /// Layer i's name in checkpoints and descriptions: a short name of its kind and its number among the
  /// layers of that kind, from 1: "fc1", "fc2" (linear), "conv1" (conv2d), "relu1", "pool1" (maxpool2d).
  [[nodiscard]] std::string layer_name(std::size_t i) const;
  /// Every layer's parameters as named arrays, "<layer name>/<param>" ("fc1/weight") with offsets into
  /// params(), in flat order: together they cover [0, num_params()) exactly once. A checkpoint stores them as
  /// its per-layer views (docs/checkpoint-format.md).
  [[nodiscard]] std::vector<TensorView> param_views() const;
  /// The model as one line of JSON, for readers outside Sinew that rebuild the forward pass from a
  /// checkpoint's views: {"spec", "input_shape": [C, H, W], "num_classes", "layers": [{"name", "kind",
  /// "input_shape", "output_shape", hyper-parameters ("kernel", "padding", "stride"), "params": {"weight":
  /// "fc1/weight", ...}}, ...]}, layers in forward order; shapes are of one sample, (channels, height,
  /// width), and a linear layer's output is (out, 1, 1).
  [[nodiscard]] std::string description_json() const;

 private:
  std::string spec_;
  Shape input_;
  int num_classes_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Slice> ranges_;  // per layer
  // Aligned to Eigen's packet size, so that every run sees the same alignment of every layer's slice:
  // Eigen's vectorised reductions peel unaligned heads, and a base address that varied between runs
  // (plain malloc) made two identical runs differ in the last bits, which broke exact resume.
  std::vector<float, Eigen::aligned_allocator<float>> params_;
  std::vector<float, Eigen::aligned_allocator<float>> grads_;
  // acts_[0] is a copy of the input, acts_[i + 1] the output of layer i. Kept between forward() and
  // backward(); resized only when the batch size changes.
  std::vector<Matrix> acts_;
  Matrix dact_[2];  // ping-pong buffers for d(loss)/d(activation) during backward()
  bool have_forward_ = false;
};

}  // namespace sinew::model
