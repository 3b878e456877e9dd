#include "sinew/train/device.hpp"

#include <mpi.h>

#include <algorithm>
#include <functional>
#include <string_view>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/model/model.hpp"
#include "sinew/optim/optimizer.hpp"

#if SINEW_HAVE_CUDA
#include "sinew/cuda/check.hpp"
#include "sinew/cuda/device.hpp"
#include "sinew/model/cuda/device_model.hpp"
#endif

namespace sinew::train {

int pick_device(std::span<const DeviceClaim> claims, int me, int count) {
  if (count <= 0)
    SINEW_THROW(InvalidArgument, "--device cuda needs a CUDA GPU; none is visible on this node");
  const auto& mine = claims[static_cast<std::size_t>(me)];
  if (mine.device >= 0) return static_cast<int>(mine.device);
  std::vector<bool> used(static_cast<std::size_t>(count), false);
  int waiting_before = 0;  // members of this node before me that have no GPU yet
  for (std::size_t r = 0; r < claims.size(); ++r) {
    if (claims[r].node != mine.node) continue;
    if (claims[r].device >= 0 && claims[r].device < count)
      used[static_cast<std::size_t>(claims[r].device)] = true;
    if (claims[r].device < 0 && static_cast<int>(r) < me) ++waiting_before;
  }
  // The members without a GPU take the free ones in rank order.
  int free_seen = 0;
  for (int d = 0; d < count; ++d) {
    if (used[static_cast<std::size_t>(d)]) continue;
    if (free_seen++ == waiting_before) return d;
  }
  return waiting_before % count;  // more members than GPUs: share them
}

int choose_device(comm::Backend& view, const comm::Options& op, int current) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  DeviceClaim mine{std::hash<std::string_view>{}(std::string_view(name, static_cast<std::size_t>(len))),
                   current};
  std::vector<DeviceClaim> all(static_cast<std::size_t>(view.size()));
  view.allgather_sync(comm::Buffer::of(std::as_writable_bytes(std::span<DeviceClaim>(&mine, 1))),
                      comm::Buffer::of(std::as_writable_bytes(std::span<DeviceClaim>(all))), op);
  int count = 0;
#if SINEW_HAVE_CUDA
  count = sinew::cuda::device_count();
#endif
  return pick_device(all, view.rank(), count);
}

#if SINEW_HAVE_CUDA

struct Device::Impl {
  model::Model& host;
  optim::Optimizer& optimizer;
  int index;
  std::string description;
  model::cuda::DeviceModel net;

  Impl(model::Model& h, optim::Optimizer& o, const optim::OptimizerOptions& options, int i, std::string d)
      : host(h), optimizer(o), index(i), description(std::move(d)), net(h, options) {
    net.upload(host, optimizer);
  }
};

std::unique_ptr<Device> Device::open(model::Model& host, optim::Optimizer& optimizer,
                                     const optim::OptimizerOptions& options, int device) {
  SINEW_CUDA(cudaSetDevice(device));
  return std::unique_ptr<Device>(new Device(std::make_unique<Impl>(
      host, optimizer, options, device, fmt::format("cuda:{} ({})", device, sinew::cuda::describe(device)))));
}

float* Device::grads() { return impl_->net.grads(); }

float Device::train_batch(const float* x, const std::int32_t* labels, std::size_t n, double denominator,
                          bool accumulate, const ReadyFn& ready) {
  return impl_->net.train_batch(x, labels, n, denominator, accumulate, ready);
}

std::pair<double, std::size_t> Device::evaluate(const float* x, const std::int32_t* labels, std::size_t n) {
  return impl_->net.evaluate(x, labels, n);
}

void Device::optimizer_step(float lr) {
  impl_->net.optimizer_step(lr);
  impl_->optimizer.set_steps(impl_->net.steps());
}

void Device::to_host() { impl_->net.download(impl_->host, impl_->optimizer); }
void Device::to_device() { impl_->net.upload(impl_->host, impl_->optimizer); }
const std::string& Device::describe() const { return impl_->description; }
int Device::index() const { return impl_->index; }

#else  // no CUDA: validate() refuses --device cuda, and open() is the only way to make a Device

struct Device::Impl {
  std::string description;
  int index = -1;
};

namespace {
[[noreturn]] void no_cuda() {
  SINEW_THROW(InvalidArgument, "--device cuda: this build of Sinew has no GPU support; use --device cpu");
}
}  // namespace

std::unique_ptr<Device> Device::open(model::Model&, optim::Optimizer&, const optim::OptimizerOptions&, int) {
  no_cuda();
}
float* Device::grads() { no_cuda(); }
float Device::train_batch(const float*, const std::int32_t*, std::size_t, double, bool, const ReadyFn&) {
  no_cuda();
}
std::pair<double, std::size_t> Device::evaluate(const float*, const std::int32_t*, std::size_t) { no_cuda(); }
void Device::optimizer_step(float) { no_cuda(); }
void Device::to_host() { no_cuda(); }
void Device::to_device() { no_cuda(); }
const std::string& Device::describe() const { return impl_->description; }
int Device::index() const { return impl_->index; }

#endif

Device::Device(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Device::~Device() = default;

}  // namespace sinew::train
