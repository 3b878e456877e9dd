// The GPU half of a view's fabric (--device cuda): the NCCL communicator, bootstrapped over the view's MPI
// backend (rank 0's unique id is broadcast over it), and the bucketer that reduces the gradients in device
// memory as the algorithm declares (algo::DeviceReduction: NCCL's allreduce, or ByteGrad's compressed
// exchange over NCCL). Built with CUDA only (train/cuda/gpu_fabric.cpp); a build without it refuses
// --device cuda (train/nocuda/gpu_fabric.cpp), so that the fabric itself never asks which build it is.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "sinew/comm/backend.hpp"
#include "sinew/comm/bucketer.hpp"
#include "sinew/core/flat.hpp"

namespace sinew::algo {
class Algorithm;
}
namespace sinew::comm::mpi {
class MpiBackend;
}
namespace sinew::comm::nccl {
class Api;
}

namespace sinew::train {

/// --shard gradients on a GPU: enqueues the reduce-scatter of the `count` device floats at `data` (at
/// `offset` in the gradients) over the NCCL backend and returns the Work that completes with it
/// (ShardedOptimizer::scatter_bucket_device).
using DeviceScatter = std::function<std::unique_ptr<comm::Work>(comm::Backend&, float* data,
                                                                std::size_t count, std::size_t offset)>;

class GpuFabric {
 public:
  GpuFabric() = default;
  GpuFabric(const GpuFabric&) = delete;
  GpuFabric& operator=(const GpuFabric&) = delete;
  GpuFabric(GpuFabric&&) = delete;
  GpuFabric& operator=(GpuFabric&&) = delete;
  virtual ~GpuFabric() = default;

  /// Aborts the NCCL communicator (a rank blocked on the GPU returns); the milliseconds it took. Never
  /// throws.
  virtual double abort() noexcept = 0;
  /// Milliseconds the NCCL communicator took to bootstrap and initialise.
  [[nodiscard]] virtual double init_ms() const = 0;
  /// The NCCL backend (device memory), for the collectives of a sharded state.
  [[nodiscard]] virtual comm::Backend& backend() = 0;
  /// The bucketer over the `n` device floats at `grads`, reducing as `algorithm` declares, or with
  /// `scatter` (--shard gradients: a bucket's reduce-scatter to its shards' holders, FabricSetup's) instead
  /// of the allreduce; it must be destroyed before this object. Throws InvalidArgument for an algorithm
  /// that runs on the CPU only, or for `scatter` with one that is not the exact allreduce.
  virtual std::unique_ptr<comm::Bucketer> bucketer(const algo::Algorithm& algorithm, float* grads,
                                                   std::size_t n, const std::vector<Slice>& ready_order,
                                                   std::size_t bucket_bytes, const comm::Options& op,
                                                   std::size_t chunk, const DeviceScatter& scatter) = 0;
};

/// Collective over `view`: creates the NCCL communicator (`api` null: the real library). Throws
/// InvalidArgument in a build without CUDA, CommFailure/Timeout if a member fails meanwhile.
std::unique_ptr<GpuFabric> make_gpu_fabric(comm::mpi::MpiBackend& view, comm::nccl::Api* api,
                                           const comm::Options& op);

}  // namespace sinew::train
