#include "sinew/train/fabric.hpp"

#include <cstddef>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "sinew/checkpoint/writer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/train/gpu_fabric.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

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
    device_grads = s.attach_device(*backend_);
    gpu_ = make_gpu_fabric(*backend_, s.nccl_api, s.op);
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
  algorithm_ = algo::make_algorithm(s.algorithm, {*backend_, work, s.op, s.compute_ms, s.algorithm_event,
                                                  s.optimizer_step, s.scatter_bucket});
  const auto bucket_bytes = static_cast<std::size_t>(s.bucket_mb * (1 << 20));
  if (gpu_) {
    // On the GPU the algorithm object stays the run's (its name, its step through the workload's
    // optimiser); the buckets are reduced as it declares.
    bucketer_ = gpu_->bucketer(*algorithm_, device_grads, grads.size(), ready_order, bucket_bytes, s.op,
                               s.algorithm.chunk, s.device_scatter);
    return;
  }
  comm::BucketOptions bo;
  bo.bucket_bytes = bucket_bytes;
  bo.overlap = s.overlap;
  bo.op = s.op;
  bo.max_backlog = s.bucket_backlog;
  if (!algorithm_->uses_backend_allreduce()) {
    bo.reduce = [a = algorithm_.get()](std::span<float> b, std::size_t offset) {
      a->reduce_bucket(b, offset);
    };
  }
  bucketer_ = std::make_unique<comm::GradientBucketer>(*backend_, grads, ready_order, std::move(bo));
}

Fabric::~Fabric() = default;

comm::Backend& Fabric::backend() noexcept { return *backend_; }

comm::Backend* Fabric::device_backend() noexcept { return gpu_ ? &gpu_->backend() : nullptr; }

double Fabric::abort() noexcept {
  const double ms = gpu_ ? gpu_->abort() : 0;
  backend_->abort();
  return ms;
}

std::uint64_t Fabric::take_bytes_sent() {
  return algorithm_->take_bytes_sent() + bucketer_->take_bytes_sent();
}

double Fabric::nccl_init_ms() const { return gpu_ ? gpu_->init_ms() : 0; }

}  // namespace sinew::train
