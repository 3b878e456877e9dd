#include "sinew/train/gpu_fabric.hpp"

#include <cstdint>
#include <utility>

#include "sinew/algo/algorithm.hpp"
#include "sinew/comm/nccl/api.hpp"
#include "sinew/comm/nccl/backend.hpp"
#include "sinew/comm/nccl/bucketer.hpp"
#include "sinew/comm/nccl/bytegrad.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::train {

namespace {

/// The device bucketer, with ByteGrad's compressed exchange when the algorithm asks for it (owned here, so
/// that its bytes count as the algorithm's).
class DeviceReduction final : public comm::Bucketer {
 public:
  DeviceReduction(comm::nccl::NcclBackend& nccl, const algo::Algorithm& a, float* grads, std::size_t n,
                  const std::vector<Slice>& ready_order, comm::nccl::DeviceBucketOptions dbo,
                  std::size_t chunk, const DeviceScatter& scatter) {
    if (scatter && a.device_reduction() != algo::DeviceReduction::kAllreduce) {
      SINEW_THROW(InvalidArgument,
                  "--shard gradients on a GPU reduce-scatters the exact gradients: not with --algorithm {}",
                  a.name());
    }
    if (scatter) {
      dbo.reduce = [&nccl, scatter](float* data, std::size_t count, std::size_t offset) {
        return scatter(nccl, data, count, offset);
      };
    }
    switch (a.device_reduction()) {
      case algo::DeviceReduction::kNone:
        SINEW_THROW(InvalidArgument, "--algorithm {} runs on the CPU only (gradients in host memory)",
                    a.name());
      case algo::DeviceReduction::kAllreduce:
        break;
      case algo::DeviceReduction::kByteGrad:
        bytegrad_ = std::make_unique<comm::nccl::ByteGrad>(nccl, n, chunk);
        dbo.reduce = [bg = bytegrad_.get(), op = dbo.op](float* data, std::size_t count, std::size_t) {
          return bg->reduce(data, count, op);
        };
        break;
    }
    bucketer_ = std::make_unique<comm::nccl::DeviceBucketer>(nccl, grads, n, ready_order, std::move(dbo));
  }
  using Bucketer::mark_ready;
  void mark_ready(Slice r, CUevent_st* ready) override { bucketer_->mark_ready(r, ready); }
  void finish() override { bucketer_->finish(); }
  [[nodiscard]] std::size_t num_buckets() const noexcept override { return bucketer_->num_buckets(); }
  [[nodiscard]] std::vector<Slice> buckets() const override { return bucketer_->buckets(); }
  [[nodiscard]] double last_comm_ms() const noexcept override { return bucketer_->last_comm_ms(); }
  [[nodiscard]] double last_exposed_ms() const noexcept override { return bucketer_->last_exposed_ms(); }
  std::uint64_t take_bytes_sent() override {
    if (!bytegrad_) return 0;
    const std::uint64_t now = bytegrad_->stats().bytes_sent;
    return now - std::exchange(counted_, now);
  }

 private:
  std::unique_ptr<comm::nccl::ByteGrad> bytegrad_;  // before the bucketer that calls it: destroyed after it
  std::unique_ptr<comm::nccl::DeviceBucketer> bucketer_;
  std::uint64_t counted_ = 0;  // bytegrad's count at the last take_bytes_sent()
};

class NcclFabric final : public GpuFabric {
 public:
  NcclFabric(comm::mpi::MpiBackend& view, comm::nccl::Api* api, const comm::Options& op)
      : nccl_(view, api != nullptr ? *api : comm::nccl::real_api(), op) {}
  double abort() noexcept override {
    const auto t = Clock::now();
    nccl_.abort();
    return seconds_since(t) * 1e3;
  }
  [[nodiscard]] double init_ms() const override { return nccl_.init_ms(); }
  [[nodiscard]] comm::Backend& backend() override { return nccl_; }
  std::unique_ptr<comm::Bucketer> bucketer(const algo::Algorithm& a, float* grads, std::size_t n,
                                           const std::vector<Slice>& ready_order, std::size_t bucket_bytes,
                                           const comm::Options& op, std::size_t chunk,
                                           const DeviceScatter& scatter) override {
    comm::nccl::DeviceBucketOptions dbo;
    dbo.bucket_bytes = bucket_bytes;
    dbo.op = op;
    return std::make_unique<DeviceReduction>(nccl_, a, grads, n, ready_order, std::move(dbo), chunk, scatter);
  }

 private:
  comm::nccl::NcclBackend nccl_;
};

}  // namespace

std::unique_ptr<GpuFabric> make_gpu_fabric(comm::mpi::MpiBackend& view, comm::nccl::Api* api,
                                           const comm::Options& op) {
  return std::make_unique<NcclFabric>(view, api, op);
}

}  // namespace sinew::train
