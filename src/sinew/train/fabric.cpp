#include "sinew/train/fabric.hpp"

#include <cstddef>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "sinew/checkpoint/writer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/workload/workload.hpp"
#if SINEW_HAVE_CUDA
#include "sinew/comm/nccl/api.hpp"
#include "sinew/comm/nccl/backend.hpp"
#include "sinew/comm/nccl/bucketer.hpp"
#include "sinew/comm/nccl/bytegrad.hpp"
#endif

namespace sinew::train {

#if SINEW_HAVE_CUDA
struct Fabric::Gpu {
  // In order of creation; destroyed in reverse.
  std::unique_ptr<comm::nccl::NcclBackend> nccl;
  std::unique_ptr<comm::nccl::ByteGrad> bytegrad;  // --algorithm bytegrad
  std::unique_ptr<comm::nccl::DeviceBucketer> bucketer;
  std::uint64_t bytegrad_sent = 0;  // bytegrad's count at the last take_bytes_sent()
};
#else
struct Fabric::Gpu {};
#endif

namespace {

constexpr int kTagConnect = 105;     // connect_peers' one-byte messages
constexpr int kConnectAllUpTo = 64;  // views this small connect every pair

/// Exchanges one byte between this process and every peer that ULFM's revoke may have to reach, so that
/// the MPI library holds an endpoint for each of them while all are alive (collective over the view).
/// Open MPI 5 creates a peer's endpoint on first use, and that asks the runtime for the peer's address
/// (PMIx_Get). When the first use is the revoke's reliable broadcast (a binomial graph: ranks r +- 2^k)
/// and the peer has just died or been cut off, PMIx_Get never returned, holding the library's endpoint
/// lock: the survivor hung in MPIX_Comm_revoke, and the others in the shrink's agreement with it
/// (net.partition hung so in 5 of 9 runs; with this exchange it passed 6 of 6). A view of up to 64 processes
/// connects every pair (the broadcast's fallback to the next live neighbour stays covered); a larger one the
/// r +- 2^k neighbours: 2 log2(n) messages each.
void connect_peers(comm::Backend& b, comm::Options op) {
  const int n = b.size(), r = b.rank();
  if (n <= 1) return;
  std::set<int> peers;
  if (n <= kConnectAllUpTo) {
    for (int p = 0; p < n; ++p)
      if (p != r) peers.insert(p);
  } else {
    for (int d = 1; d < n; d *= 2) {
      peers.insert((r + d) % n);
      peers.insert((r - d % n + n) % n);
    }
    peers.erase(r);
  }
  op.tag = kTagConnect;
  std::vector<std::byte> out(peers.size()), in(peers.size());
  std::vector<std::unique_ptr<comm::Work>> works;
  std::size_t i = 0;
  for (const int p : peers) {
    works.push_back(b.recv(comm::Buffer::of(std::span<std::byte>(&in[i], 1)), p, op));
    works.push_back(b.send(comm::Buffer::of(std::span<std::byte>(&out[i], 1)), p, op));
    ++i;
  }
  for (auto& w : works) w->wait(op.timeout);
}

}  // namespace

Fabric::Fabric(const membership::Group& group, const FabricSetup& s)
    : backend_(std::make_unique<comm::mpi::MpiBackend>(group.comm())) {
  rank_ = backend_->rank();
  size_ = backend_->size();
  connect_peers(*backend_, s.op);
  float* device_grads = nullptr;
  if (s.attach_device) {
#if SINEW_HAVE_CUDA
    device_grads = s.attach_device(*backend_);
    gpu_ = std::make_unique<Gpu>();
    auto& api = s.nccl_api != nullptr ? *s.nccl_api : comm::nccl::real_api();
    gpu_->nccl = std::make_unique<comm::nccl::NcclBackend>(*backend_, api, s.op);
#else
    SINEW_THROW(InvalidArgument, "--device cuda: this build of Sinew has no GPU support; use --device cpu");
#endif
  }
  if (!s.checkpoint_dir.empty()) {
    checkpoint::WriterOptions wo;
    wo.keep = s.checkpoint_keep;
    wo.op = s.op;
    wo.faults = s.faults;
    writer_ = std::make_unique<checkpoint::Writer>(s.checkpoint_dir, *backend_, wo);
  }
  SINEW_ENFORCE(s.work != nullptr, "a fabric without a workload");
  workload::Workload& work = *s.work;
  const std::span<float> grads = work.grads();
  const std::vector<Slice> ready_order = work.ready_order();
  algorithm_ = algo::make_algorithm(s.algorithm, {*backend_, work, s.op, s.compute_ms, s.algorithm_event});
  const auto bucket_bytes = static_cast<std::size_t>(s.bucket_mb * (1 << 20));
#if SINEW_HAVE_CUDA
  if (gpu_) {
    // On the GPU the algorithm object stays the run's (its name, its step through the workload's
    // optimiser); the buckets are reduced as it declares: NCCL's allreduce, or ByteGrad's compressed
    // exchange over NCCL.
    comm::nccl::DeviceBucketOptions dbo;
    dbo.bucket_bytes = bucket_bytes;
    dbo.op = s.op;
    switch (algorithm_->device_reduction()) {
      case algo::DeviceReduction::kNone:
        SINEW_THROW(InvalidArgument, "--algorithm {} runs on the CPU only (gradients in host memory)",
                    algorithm_->name());
      case algo::DeviceReduction::kAllreduce:
        break;
      case algo::DeviceReduction::kByteGrad:
        gpu_->bytegrad = std::make_unique<comm::nccl::ByteGrad>(*gpu_->nccl, grads.size(), s.algorithm.chunk);
        dbo.reduce = [bg = gpu_->bytegrad.get(), op = s.op](float* data, std::size_t count, std::size_t) {
          return bg->reduce(data, count, op);
        };
        break;
    }
    gpu_->bucketer = std::make_unique<comm::nccl::DeviceBucketer>(*gpu_->nccl, device_grads, grads.size(),
                                                                  ready_order, std::move(dbo));
    return;
  }
#endif
  (void)device_grads;
  comm::BucketOptions bo;
  bo.bucket_bytes = bucket_bytes;
  bo.overlap = s.overlap;
  bo.op = s.op;
  if (!algorithm_->uses_backend_allreduce()) {
    bo.reduce = [a = algorithm_.get()](std::span<float> b, std::size_t offset) {
      a->reduce_bucket(b, offset);
    };
  }
  bucketer_ = std::make_unique<comm::GradientBucketer>(*backend_, grads, ready_order, std::move(bo));
}

Fabric::~Fabric() = default;

comm::Backend& Fabric::backend() noexcept { return *backend_; }

double Fabric::abort() noexcept {
  double ms = 0;
#if SINEW_HAVE_CUDA
  if (gpu_) {
    const auto t = Clock::now();
    gpu_->nccl->abort();
    ms = seconds_since(t) * 1e3;
  }
#endif
  backend_->abort();
  return ms;
}

void Fabric::mark_ready(Slice r) { bucketer_->mark_ready(r); }

void Fabric::mark_ready(Slice r, CUevent_st* ready) {
#if SINEW_HAVE_CUDA
  gpu_->bucketer->mark_ready(r, ready);
#else
  (void)r;
  (void)ready;
  SINEW_THROW(InternalError, "a device gradient range was reported in a build without CUDA");
#endif
}

void Fabric::finish_reduction() {
#if SINEW_HAVE_CUDA
  if (gpu_) {
    gpu_->bucketer->finish();
    return;
  }
#endif
  bucketer_->finish();
}

std::size_t Fabric::num_buckets() const {
#if SINEW_HAVE_CUDA
  if (gpu_) return gpu_->bucketer->num_buckets();
#endif
  return bucketer_->num_buckets();
}

double Fabric::last_comm_ms() const {
#if SINEW_HAVE_CUDA
  if (gpu_) return gpu_->bucketer->last_comm_ms();
#endif
  return bucketer_->last_comm_ms();
}

double Fabric::last_exposed_ms() const {
#if SINEW_HAVE_CUDA
  if (gpu_) return gpu_->bucketer->last_exposed_ms();
#endif
  return bucketer_->last_exposed_ms();
}

std::uint64_t Fabric::take_bytes_sent() {
  std::uint64_t sent = algorithm_->take_bytes_sent();
#if SINEW_HAVE_CUDA
  if (gpu_ && gpu_->bytegrad) {
    const std::uint64_t now = gpu_->bytegrad->stats().bytes_sent;
    sent += now - std::exchange(gpu_->bytegrad_sent, now);
  }
#endif
  return sent;
}

double Fabric::nccl_init_ms() const {
#if SINEW_HAVE_CUDA
  if (gpu_) return gpu_->nccl->init_ms();
#endif
  return 0;
}

}  // namespace sinew::train
