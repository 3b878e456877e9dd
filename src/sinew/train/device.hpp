// Which GPU each member of the group trains on (--device cuda, docs/gpu.md). The training itself is the
// workload's (model/cuda/workload.hpp); this is the group's agreement on who takes which GPU.
#pragma once

#include <cstdint>
#include <span>

namespace sinew::comm {
class Backend;
struct Options;
}  // namespace sinew::comm

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
/// GPU and returns the GPU for this member (pick_device) among the `count` its node has. A member that
/// already has a GPU keeps it, so a spawned replacement takes the GPU its predecessor left free instead of
/// one a survivor holds.
int choose_device(comm::Backend& view, const comm::Options& op, int current, int count);

}  // namespace sinew::train
