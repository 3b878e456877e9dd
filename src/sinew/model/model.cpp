#include "sinew/model/model.hpp"

#include <fmt/format.h>

#include <charconv>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "sinew/core/error.hpp"

namespace sinew::model {

namespace {

std::string shape_str(const Shape& s) { return fmt::format("{}x{}x{}", s.channels, s.height, s.width); }

/// The short name of a layer kind in layer names ("fc1", "conv1", "pool1").
std::string short_name(const std::string& kind) {
  if (kind == "linear") return "fc";
  if (kind == "conv2d") return "conv";
  if (kind == "maxpool2d") return "pool";
  return kind;
}

nlohmann::ordered_json shape_json(const Shape& s) { return {s.channels, s.height, s.width}; }

/// Parses "512,256,..." into positive layer widths; throws InvalidArgument naming the whole spec.
std::vector<int> parse_hidden_sizes(const std::string& spec, std::string_view list) {
  constexpr int kMaxWidth = 1 << 20;
  std::vector<int> sizes;
  while (true) {
    const std::size_t comma = list.find(',');
    const std::string_view token = list.substr(0, comma);
    int value = 0;
    const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
    if (token.empty() || ec != std::errc{} || end != token.data() + token.size() || value < 1 ||
        value > kMaxWidth) {
      SINEW_THROW(InvalidArgument,
                  "model spec '{}': hidden size '{}' is not an integer in [1, {}]; valid specs: {}", spec,
                  token, kMaxWidth, Model::kValidSpecs);
    }
    sizes.push_back(value);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return sizes;
}

/// Appends a layer and returns its output shape (the next layer's input).
template <class L, class... Args>
Shape add(std::vector<std::unique_ptr<Layer>>& layers, Args&&... args) {
  layers.push_back(std::make_unique<L>(std::forward<Args>(args)...));
  return layers.back()->output_shape();
}

}  // namespace

Model Model::build(const std::string& spec, const Shape& input, int num_classes, std::uint64_t seed) {
  if (input.channels < 1 || input.height < 1 || input.width < 1) {
    SINEW_THROW(InvalidArgument, "model '{}': input shape {} has a non-positive dimension", spec,
                shape_str(input));
  }
  if (num_classes < 1) SINEW_THROW(InvalidArgument, "model '{}': need >= 1 class, got {}", spec, num_classes);

  const std::size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const bool has_args = colon != std::string::npos;

  std::vector<std::unique_ptr<Layer>> layers;

  if (name == "logreg" && !has_args) {
    add<Linear>(layers, input, num_classes);
  } else if (name == "mlp") {
    const std::vector<int> hidden = has_args
                                        ? parse_hidden_sizes(spec, std::string_view(spec).substr(colon + 1))
                                        : std::vector<int>{512, 512};
    Shape shape = input;
    for (const int width : hidden) {
      shape = add<Linear>(layers, shape, width);
      shape = add<ReLU>(layers, shape);
    }
    add<Linear>(layers, shape, num_classes);
  } else if (name == "cnn" && !has_args) {
    if (input.height < 4 || input.width < 4) {
      SINEW_THROW(InvalidArgument,
                  "model 'cnn' needs inputs of at least 4x4 pixels, got {}; use mlp or logreg",
                  shape_str(input));
    }
    Shape shape = add<Conv2d>(layers, input, 16, 3, 1);
    shape = add<ReLU>(layers, shape);
    shape = add<MaxPool2d>(layers, shape);
    shape = add<Conv2d>(layers, shape, 32, 3, 1);
    shape = add<ReLU>(layers, shape);
    shape = add<MaxPool2d>(layers, shape);
    shape = add<Linear>(layers, shape, 128);
    shape = add<ReLU>(layers, shape);
    add<Linear>(layers, shape, num_classes);
  } else {
    SINEW_THROW(InvalidArgument, "unknown model spec '{}'; valid specs: {}", spec, kValidSpecs);
  }
  return from_layers(std::move(layers), seed, spec);
}

Model Model::from_layers(std::vector<std::unique_ptr<Layer>> layers, std::uint64_t seed, std::string spec) {
  if (layers.empty()) SINEW_THROW(InvalidArgument, "model '{}' has no layers", spec);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i]) SINEW_THROW(InvalidArgument, "model '{}': layer {} is null", spec, i);
    if (i > 0 && !(layers[i]->input_shape() == layers[i - 1]->output_shape())) {
      SINEW_THROW(InvalidArgument, "model '{}': layer {} ({}) expects input {} but layer {} produces {}",
                  spec, i, layers[i]->kind(), shape_str(layers[i]->input_shape()), i - 1,
                  shape_str(layers[i - 1]->output_shape()));
    }
  }
  const Shape& last = layers.back()->output_shape();

  Model m;
  m.spec_ = std::move(spec);
  m.input_ = layers.front()->input_shape();
  m.num_classes_ = last.size();
  std::size_t offset = 0;
  for (const auto& layer : layers) {
    m.ranges_.push_back(Slice{offset, layer->num_params()});
    offset += layer->num_params();
  }
  m.layers_ = std::move(layers);
  m.params_.assign(offset, 0.f);
  m.grads_.assign(offset, 0.f);
  m.acts_.resize(m.layers_.size() + 1);

  // One random stream, consumed layer by layer in flat-buffer order: the seed alone fixes every parameter.
  Rng rng(seed);
  for (std::size_t i = 0; i < m.layers_.size(); ++i) {
    const Slice r = m.ranges_[i];
    m.layers_[i]->init_params(std::span<float>(m.params_).subspan(r.offset, r.count), rng);
  }
  return m;
}

Model Model::clone() const {
  Model m;
  m.spec_ = spec_;
  m.input_ = input_;
  m.num_classes_ = num_classes_;
  for (const auto& layer : layers_) m.layers_.push_back(layer->clone());
  m.ranges_ = ranges_;
  m.params_ = params_;
  m.grads_ = grads_;
  m.acts_.resize(acts_.size());
  return m;
}

const Matrix& Model::forward(const Eigen::Ref<const Matrix>& x) {
  if (layers_.empty()) SINEW_THROW(InvalidArgument, "forward() on an empty model");
  if (x.rows() != input_.size()) {
    SINEW_THROW(InvalidArgument,
                "model '{}': input has {} rows, expected {} (shape {}), one column per sample", spec_,
                x.rows(), input_.size(), shape_str(input_));
  }
  have_forward_ = false;  // stays false if a layer throws
  acts_[0] = x;           // a copy: backward() needs the input after the caller's buffer may be gone
  const std::span<const float> params(params_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(acts_[i], params.subspan(ranges_[i].offset, ranges_[i].count), acts_[i + 1]);
  }
  have_forward_ = true;
  return acts_.back();
}

void Model::backward(const Matrix& dlogits, const std::function<void(Slice)>& on_grad_ready,
                     bool accumulate) {
  if (!have_forward_)
    SINEW_THROW(InvalidArgument, "model '{}': backward() without a preceding forward()", spec_);
  const Matrix& logits = acts_.back();
  if (dlogits.rows() != logits.rows() || dlogits.cols() != logits.cols()) {
    SINEW_THROW(InvalidArgument, "model '{}': dlogits is {}x{}, but the last forward() produced {}x{} logits",
                spec_, dlogits.rows(), dlogits.cols(), logits.rows(), logits.cols());
  }
  const std::span<const float> params(params_);
  const std::span<float> grads(grads_);
  const Matrix* dy = &dlogits;
  for (std::size_t i = layers_.size(); i-- > 0;) {
    Layer& layer = *layers_[i];
    const Slice r = ranges_[i];
    if (r.count > 0) {
      layer.backward_params(acts_[i], acts_[i + 1], *dy, grads.subspan(r.offset, r.count), accumulate);
      // This range is final now: nothing below writes it again, so its reduction can start at once,
      // overlapping with the rest of backward().
      if (on_grad_ready) on_grad_ready(r);
    }
    if (i > 0) {                  // the gradient with respect to the model input is never needed
      Matrix& dx = dact_[i % 2];  // never the buffer *dy lives in: that is dact_[(i + 1) % 2] or dlogits
      layer.backward_input(acts_[i], acts_[i + 1], *dy, params.subspan(r.offset, r.count), dx);
      dy = &dx;
    }
  }
}

std::vector<Slice> Model::grad_ready_order() const {
  std::vector<Slice> order;
  for (auto it = ranges_.rbegin(); it != ranges_.rend(); ++it) {
    if (it->count > 0) order.push_back(*it);
  }
  return order;
}

std::string Model::layer_name(std::size_t i) const {
  const std::string kind = layers_.at(i)->kind();
  std::size_t number = 0;
  for (std::size_t j = 0; j <= i; ++j) number += layers_[j]->kind() == kind ? 1 : 0;
  return fmt::format("{}{}", short_name(kind), number);
}

std::vector<TensorView> Model::param_views() const {
  std::vector<TensorView> views;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const std::string prefix = layer_name(i) + "/";
    for (TensorView v : layers_[i]->param_views()) {
      v.name = prefix + v.name;
      v.offset += ranges_[i].offset;
      views.push_back(std::move(v));
    }
  }
  return views;
}

std::string Model::description_json() const {
  using json = nlohmann::ordered_json;  // keys in the order written
  json layers = json::array();
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    const std::string name = layer_name(i);
    json l = {{"name", name},
              {"kind", layer.kind()},
              {"input_shape", shape_json(layer.input_shape())},
              {"output_shape", shape_json(layer.output_shape())}};
    for (const auto& [key, value] : layer.hyper_params()) l[key] = value;
    json params = json::object();
    for (const TensorView& v : layer.param_views()) params[v.name] = name + "/" + v.name;
    l["params"] = std::move(params);
    layers.push_back(std::move(l));
  }
  const json j = {{"spec", spec_},
                  {"input_shape", shape_json(input_)},
                  {"num_classes", num_classes_},
                  {"layers", std::move(layers)}};
  return j.dump();
}

std::string Model::summary() const {
  std::string out = fmt::format("model '{}': input {}, {} classes\n", spec_, shape_str(input_), num_classes_);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const Layer& layer = *layers_[i];
    out += fmt::format("  {:>2} {:<34} {:>10} -> {:<10} {:>10} params\n", i, layer.describe(),
                       shape_str(layer.input_shape()), shape_str(layer.output_shape()), ranges_[i].count);
  }
  out += fmt::format("  total {} params ({:.2f} MiB as float32)", num_params(),
                     static_cast<double>(num_params()) * sizeof(float) / (1024.0 * 1024.0));
  return out;
}

}  // namespace sinew::model
