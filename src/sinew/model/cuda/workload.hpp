// The built-in model on a GPU as a workload (--device cuda, docs/gpu.md): model::cuda::DeviceModel trains,
// the gradients are reduced in device memory (NCCL, through the fabric's DeviceBucketer), and the fused
// optimiser step runs there. The host ModelWorkload it wraps stays the run's record of the state:
// whatever reads or writes the replicated state (checkpoints, the state sync after a change of membership,
// resume) reads the host buffers after to_host() and writes them before to_device().
//
// The device is opened by the first attach_device() (in the first fabric's construction, once the group
// agreed on which member takes which GPU); before that nothing trains.
#pragma once

#include <memory>
#include <string>

#include "sinew/model/cuda/device_model.hpp"
#include "sinew/model/workload.hpp"

namespace sinew::model::cuda {

class DeviceWorkload final : public workload::Workload {
 public:
  /// Throws InvalidArgument for a model the GPU path lacks (check_supported); needs no GPU yet.
  DeviceWorkload(std::unique_ptr<ModelWorkload> host, const optim::OptimizerOptions& options);
  DeviceWorkload(const DeviceWorkload&) = delete;
  DeviceWorkload& operator=(const DeviceWorkload&) = delete;
  DeviceWorkload(DeviceWorkload&&) = delete;
  DeviceWorkload& operator=(DeviceWorkload&&) = delete;
  ~DeviceWorkload() override;

  [[nodiscard]] std::string describe() const override;
  [[nodiscard]] std::vector<Slice> ready_order() const override { return host_->ready_order(); }
  [[nodiscard]] std::vector<TensorView> views() const override { return host_->views(); }
  [[nodiscard]] std::string description_json() const override { return host_->description_json(); }
  [[nodiscard]] std::span<float> params() override { return host_->params(); }
  [[nodiscard]] std::span<float> grads() override { return host_->grads(); }
  [[nodiscard]] std::string optimizer_name() const override { return host_->optimizer_name(); }
  /// False over a host workload built for a sharded optimiser state (ModelSpec::shard_optimizer): the device
  /// then holds parameters and gradients only, and the runtime steps the shards on the host.
  [[nodiscard]] bool has_optimizer() const override { return host_->has_optimizer(); }
  [[nodiscard]] NamedSpans optimizer_state() override { return host_->optimizer_state(); }
  [[nodiscard]] std::int64_t optimizer_steps() const override { return host_->optimizer_steps(); }
  void set_optimizer_steps(std::int64_t steps) override { host_->set_optimizer_steps(steps); }
  /// On the device; the host optimiser's step count follows.
  void optimizer_step(float lr) override;
  /// On the device: micro-batches accumulate in device memory, ranges are reported with their events
  /// (hooks.device_ready). Distillation is refused (train::validate does so first).
  float train(const workload::MicroBatch& batch, const workload::TrainHooks& hooks) override;
  workload::EvalSums evaluate(std::span<const std::size_t> indices) override;

  [[nodiscard]] bool on_device() const override { return true; }
  [[nodiscard]] int device() const override { return index_; }
  [[nodiscard]] int visible_devices() const override;
  float* attach_device(int index) override;
  void to_host() override;
  void to_device() override;
  void grads_to_host(std::span<const Slice> ranges) override;
  void params_to_device(std::span<const Slice> ranges) override;
  [[nodiscard]] std::span<float> device_params() override;

 private:
  DeviceModel& net();

  std::unique_ptr<ModelWorkload> host_;
  optim::OptimizerOptions options_;
  int index_ = -1;
  std::string description_;
  std::unique_ptr<DeviceModel> device_;
  Matrix x_;  // a micro-batch's inputs in host memory (the device model uploads them)
  std::vector<std::int32_t> labels_;
};

}  // namespace sinew::model::cuda
