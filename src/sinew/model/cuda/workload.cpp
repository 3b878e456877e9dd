#include "sinew/model/cuda/workload.hpp"

#include <cuda_runtime_api.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "sinew/core/error.hpp"
#include "sinew/cuda/check.hpp"
#include "sinew/cuda/device.hpp"

namespace sinew::model::cuda {

DeviceWorkload::DeviceWorkload(std::unique_ptr<ModelWorkload> host, const optim::OptimizerOptions& options)
    : host_(std::move(host)), options_(options) {
  check_supported(host_->model());
}

DeviceWorkload::~DeviceWorkload() = default;

std::string DeviceWorkload::describe() const {
  return index_ < 0 ? host_->describe() + " for a GPU" : host_->describe() + " on " + description_;
}

DeviceModel& DeviceWorkload::net() {
  SINEW_ENFORCE(device_ != nullptr, "{}: trained before attach_device() chose its GPU", host_->describe());
  return *device_;
}

int DeviceWorkload::visible_devices() const { return sinew::cuda::device_count(); }

float* DeviceWorkload::attach_device(int index) {
  if (!device_) {
    SINEW_CUDA(cudaSetDevice(index));
    index_ = index;
    description_ = fmt::format("cuda:{} ({})", index, sinew::cuda::describe(index));
    device_ = std::make_unique<DeviceModel>(host_->model(), options_, host_->has_optimizer());
    to_device();
  }
  return device_->grads();
}

float DeviceWorkload::train(const workload::MicroBatch& batch, const workload::TrainHooks& hooks) {
  SINEW_ENFORCE(!hooks.teacher, "{}: distillation runs on the CPU only", host_->describe());
  const std::size_t n = batch.indices.size();
  const data::Dataset& data = host_->train_data();
  if (n > 0) {
    x_.resize(data.dim(), static_cast<Eigen::Index>(n));
    labels_.resize(n);
    data.gather(batch.indices, x_.data(), labels_.data());
    // The device runs forward and backward in one call: "between" them is before it.
    if (hooks.before_backward) hooks.before_backward();
  }
  // An empty micro-batch (the epoch's last step can leave a rank without samples) leaves zeros or adds
  // nothing, and still reports every range.
  return net().train_batch(x_.data(), labels_.data(), n, batch.denominator, batch.accumulate,
                           hooks.device_ready);
}

workload::EvalSums DeviceWorkload::evaluate(std::span<const std::size_t> indices) {
  const std::size_t n = indices.size();
  if (n == 0) return {};
  const data::Dataset& data = host_->test_data();
  x_.resize(data.dim(), static_cast<Eigen::Index>(n));
  labels_.resize(n);
  data.gather(indices, x_.data(), labels_.data());
  const auto [loss, correct] = net().evaluate(x_.data(), labels_.data(), n);
  return {loss, correct};
}

void DeviceWorkload::optimizer_step(float lr) {
  net().optimizer_step(lr);  // (refused with a sharded state: the runtime steps the shards)
  host_->set_optimizer_steps(device_->steps());
}

void DeviceWorkload::to_host() {
  if (!device_) return;
  if (host_->has_optimizer()) {
    device_->download(host_->model(), host_->optimizer());
  } else {
    device_->download_params(host_->params());
  }
}

void DeviceWorkload::to_device() {
  if (!device_) return;
  if (host_->has_optimizer()) {
    device_->upload(host_->model(), host_->optimizer());
  } else {
    device_->upload_params(host_->params());
  }
}

void DeviceWorkload::grads_to_host(std::span<const Slice> ranges) {
  // The reduction that wrote them has completed (the runtime waited for it before the update).
  for (const Slice r : ranges) net().download_grads(r.of(host_->grads()), r.offset);
}

void DeviceWorkload::params_to_device(std::span<const Slice> ranges) {
  for (const Slice r : ranges) net().upload_params(r.of(host_->params()), r.offset);
}

std::span<float> DeviceWorkload::device_params() { return {net().params(), net().num_params()}; }

}  // namespace sinew::model::cuda
