// Sinew's own models as a workload (workload/workload.hpp): a model::Model (Eigen, on the CPU) with one of
// Sinew's fused optimisers over its flat buffers, trained on an in-memory data::Dataset. With --device cuda
// the same model trains on a GPU (model/cuda/workload.hpp); make_workload() picks the one asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sinew/data/dataset.hpp"
#include "sinew/model/model.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::model {

/// The model on the CPU: forward and backward with Eigen, the fused optimiser over the flat buffers.
class ModelWorkload final : public workload::Workload {
 public:
  /// `train` and `test` are not copied: they must outlive the workload. A null `optimizer`: the runtime
  /// keeps the optimiser's state, sharded over the ranks (--shard optimizer, train/shards.hpp), and steps
  /// it; this workload then has none (has_optimizer() false), and `optimizer_name` names it.
  ModelWorkload(Model net, std::unique_ptr<optim::Optimizer> optimizer, const data::Dataset& train,
                const data::Dataset& test, std::string optimizer_name = {});

  [[nodiscard]] Model& model() noexcept { return net_; }
  [[nodiscard]] optim::Optimizer& optimizer() noexcept { return *optimizer_; }
  [[nodiscard]] const data::Dataset& train_data() const noexcept { return train_; }
  [[nodiscard]] const data::Dataset& test_data() const noexcept { return test_; }

  [[nodiscard]] std::string describe() const override;
  [[nodiscard]] std::vector<Slice> ready_order() const override { return net_.grad_ready_order(); }
  [[nodiscard]] std::vector<TensorView> views() const override { return net_.param_views(); }
  [[nodiscard]] std::string description_json() const override { return net_.description_json(); }
  [[nodiscard]] std::span<float> params() override { return net_.params(); }
  [[nodiscard]] std::span<float> grads() override { return net_.grads(); }
  [[nodiscard]] std::string optimizer_name() const override {
    return optimizer_ ? optimizer_->name() : optimizer_name_;
  }
  [[nodiscard]] bool has_optimizer() const override { return optimizer_ != nullptr; }
  [[nodiscard]] NamedSpans optimizer_state() override {
    return optimizer_ ? optimizer_->state() : NamedSpans{};
  }
  [[nodiscard]] std::int64_t optimizer_steps() const override { return optimizer_ ? optimizer_->steps() : 0; }
  void set_optimizer_steps(std::int64_t steps) override {
    if (optimizer_) optimizer_->set_steps(steps);
  }
  void optimizer_step(float lr) override;
  float train(const workload::MicroBatch& batch, const workload::TrainHooks& hooks) override;
  workload::EvalSums evaluate(std::span<const std::size_t> indices) override;

 private:
  Model net_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::string optimizer_name_;
  const data::Dataset& train_;
  const data::Dataset& test_;
  Matrix x_, dlogits_;  // kept between calls: resized only when the batch size changes
  std::vector<std::int32_t> labels_;
};

/// The built-in workload `spec` asks for, over the data's sample shape and classes: a ModelWorkload, or
/// with device "cuda" the GPU one (InvalidArgument in a build without CUDA, or for a model the GPU
/// lacks). `data` must outlive it. Throws InvalidArgument for a bad model spec or optimiser option.
std::unique_ptr<workload::Workload> make_workload(const workload::ModelSpec& spec,
                                                  const data::DataSplit& data);

}  // namespace sinew::model
