// The fabric: everything built over one view of the group, rebuilt after every change of membership.
//
// It owns, in order of creation, the MPI backend (a duplicate of the view's communicator), with
// --device cuda the NCCL backend (bootstrapped through the MPI backend: rank 0's unique id is broadcast
// over it), the checkpoint writer (MPI backend), the communication algorithm (MPI backend) and the
// gradient bucketer (comm::Bucketer: the host one with its communication thread over the MPI backend, or
// with --device cuda the device one over NCCL, from gpu_fabric.hpp). Members are declared in that order, so
// they are destroyed in reverse: the bucketer stops before the algorithm and the backends it uses go.
//
//   abort()      after a failure or a missed deadline: aborts the NCCL communicator first (a rank blocked
//                on the GPU returns; NCCL must not outlive the MPI view it was built from), then makes
//                every pending and future MPI operation fail here and (ULFM revoke) at the peers, so that
//                nothing stays blocked in the old view. Never throws. The fabric is then only good for
//                destruction.
//   destruction  a clean teardown (a planned change: every member agrees), in reverse order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "sinew/algo/algorithm.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/comm/bucketer.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/train/gpu_fabric.hpp"

namespace sinew::checkpoint {
class Writer;
}
namespace sinew::comm::mpi {
class MpiBackend;
}
namespace sinew::comm::nccl {
class Api;
}
namespace sinew::membership {
class Group;
}
namespace sinew::workload {
class Workload;
}

namespace sinew::train {

/// What every view's fabric is built with (the same for all views of a run).
struct FabricSetup {
  comm::Options op;            ///< deadline of every collective
  std::string checkpoint_dir;  ///< empty: no checkpoint writer
  int checkpoint_keep = 3;
  const fault::Plan* faults = nullptr;  ///< checkpoint-writer fault points (not owned)
  algo::AlgorithmOptions algorithm;
  double bucket_mb = 4;
  bool overlap = true;
  /// What is trained (not owned): its flat buffers, ready order and optimiser.
  workload::Workload* work = nullptr;
  std::function<double()> compute_ms;                          ///< for `--algorithm auto`
  std::function<void(const nlohmann::json&)> algorithm_event;  ///< the algorithm's own events
  std::function<void(float lr)> optimizer_step;  ///< a sharded optimiser's step (algo::Context's)
  /// --shard gradients: a bucket's reduce-scatter to its shards' holders (algo::Context's)
  std::function<void(comm::Backend&, std::span<float>, std::size_t, const algo::Quantization*)>
      scatter_bucket;
  /// The host bucketer's comm::BucketOptions::max_backlog (--shard parameters: the gradients of a bucket are
  /// released once reduced, so backward must not run far ahead of the reductions).
  std::size_t bucket_backlog = 0;
  /// A workload on a GPU: collective over the view's MPI backend, picks this member's GPU (opening it the
  /// first time) and returns the gradients in device memory (the flat layout), which NCCL then reduces
  /// as the algorithm declares (algo::DeviceReduction). Empty: the CPU path.
  std::function<float*(comm::Backend& view)> attach_device;
  /// --shard gradients on a GPU: the device bucketer's reduce-scatter of a bucket, instead of scatter_bucket.
  DeviceScatter device_scatter;
  /// The NCCL entry points; null: the real library (tests put comm::nccl::FakeApi here).
  comm::nccl::Api* nccl_api = nullptr;
};

class Fabric {
 public:
  /// Collective over the view: duplicates its communicator, with --device cuda creates the NCCL
  /// communicator, agrees on the checkpoint directory, and (`--algorithm auto`) measures the bandwidth.
  /// Throws CommFailure/Timeout if a member fails meanwhile.
  Fabric(const membership::Group& group, const FabricSetup& setup);
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  Fabric(Fabric&&) = delete;
  Fabric& operator=(Fabric&&) = delete;
  ~Fabric();

  /// Returns the milliseconds spent aborting the NCCL communicator (0 without one).
  double abort() noexcept;

  [[nodiscard]] comm::Backend& backend() noexcept;
  /// --device cuda: the NCCL backend over the same view (device memory); null on the CPU.
  [[nodiscard]] comm::Backend* device_backend() noexcept;
  [[nodiscard]] algo::Algorithm& algorithm() noexcept { return *algorithm_; }

  /// Bytes this rank sent for the algorithm since the last call (the algorithm's, or ByteGrad's on the GPU).
  [[nodiscard]] std::uint64_t take_bytes_sent();
  /// The step's gradient reduction (train/reducer.hpp drives it).
  [[nodiscard]] comm::Bucketer& bucketer() noexcept { return *bucketer_; }
  /// Milliseconds the NCCL communicator took to bootstrap and initialise (0 without one).
  [[nodiscard]] double nccl_init_ms() const;
  /// Null without --checkpoint-dir.
  [[nodiscard]] checkpoint::Writer* writer() noexcept { return writer_.get(); }
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }

 private:
  int rank_ = 0, size_ = 1;
  std::unique_ptr<comm::mpi::MpiBackend> backend_;
  std::unique_ptr<GpuFabric> gpu_;  // --device cuda: the NCCL communicator, bootstrapped over backend_
  std::unique_ptr<checkpoint::Writer> writer_;
  std::unique_ptr<algo::Algorithm> algorithm_;
  std::unique_ptr<comm::Bucketer> bucketer_;
};

}  // namespace sinew::train
