// The model's working copy on a GPU (--device cuda, docs/gpu.md).
//
// With --device cuda each rank trains on one GPU: the flat parameter, gradient and optimiser buffers live
// in device memory (model::cuda::DeviceModel), the gradients are reduced there by NCCL (the fabric's
// DeviceBucketer), and the fused optimiser step runs there. The host Model and Optimizer stay the
// run's record of the state: whatever reads or writes the replicated state (checkpoints, the state
// synchronisation after a change of membership, resume) goes through TrainState, which copies the state
// to the host before it reads it (to_host) and back after it wrote it (to_device).
//
// The header needs no CUDA: without CUDA support, open() throws InvalidArgument (validate() already
// refuses --device cuda in such a build) and nothing else is reachable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "sinew/model/layers.hpp"

struct CUevent_st;  // cudaEvent_t is CUevent_st*

namespace sinew::comm {
class Backend;
struct Options;
}  // namespace sinew::comm
namespace sinew::model {
class Model;
}
namespace sinew::optim {
class Optimizer;
struct OptimizerOptions;
}  // namespace sinew::optim

namespace sinew::train {

/// What choose_device() gathers from every member of the view.
struct DeviceClaim {
  std::uint64_t node = 0;    ///< hash of the host name (MPI_Get_processor_name)
  std::int64_t device = -1;  ///< the GPU it uses, -1 for none yet
};

/// The GPU for member `me` of `claims` on a node with `count` GPUs: the one it already uses, else the
/// lowest one no other member on its node uses, else (more members than GPUs on the node) its index
/// among the node's members without a GPU, modulo `count`. Pure, for tests; throws InvalidArgument when
/// count is 0.
int pick_device(std::span<const DeviceClaim> claims, int me, int count);

/// Collective over `view` (the group's MPI backend; no new communicator): gathers every member's host and
/// GPU and returns the GPU for this member (pick_device). A member that already has a GPU keeps it, so a
/// spawned replacement takes the GPU its predecessor left free instead of one a survivor holds.
int choose_device(comm::Backend& view, const comm::Options& op, int current);

class Device {
 public:
  using Event = CUevent_st*;
  /// Called per layer with parameters, in backward order, once its gradient kernels are enqueued; the
  /// event completes when they have run.
  using ReadyFn = std::function<void(model::ParamRange, Event)>;

  /// Makes GPU `device` current and copies the host model and optimiser state to it. Throws
  /// InvalidArgument without CUDA support or for a model the GPU path lacks.
  static std::unique_ptr<Device> open(model::Model& host, optim::Optimizer& optimizer,
                                      const optim::OptimizerOptions& options, int device);
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  Device(Device&&) = delete;
  Device& operator=(Device&&) = delete;
  ~Device();

  /// The gradients in device memory (the host model's layout).
  [[nodiscard]] float* grads();
  /// One micro-batch (x: host memory, one column per sample), forward, loss with the step's global
  /// sample count as `denominator`, backward; `accumulate` adds to the gradients. Returns this rank's
  /// share of the mean loss. n == 0 contributes nothing (zero gradients unless accumulating) and still
  /// reports every range.
  float train_batch(const float* x, const std::int32_t* labels, std::size_t n, double denominator,
                    bool accumulate, const ReadyFn& ready);
  /// {sum of losses, correct predictions} over a chunk of the test set.
  std::pair<double, std::size_t> evaluate(const float* x, const std::int32_t* labels, std::size_t n);
  /// The fused optimiser step on the device; the host optimiser's step count follows.
  void optimizer_step(float lr);

  /// Copies parameters and optimiser state device -> host (before the state is read) and back.
  void to_host();
  void to_device();
  /// "cuda:0 (NVIDIA H200, 139 GiB, 132 SMs)".
  [[nodiscard]] const std::string& describe() const;
  /// The GPU's index.
  [[nodiscard]] int index() const;

 private:
  struct Impl;
  explicit Device(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::train
