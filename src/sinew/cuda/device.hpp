// Which GPU a rank uses, and what it is.
#pragma once

#include <mpi.h>

#include <string>

namespace sinew::cuda {

/// GPUs this process can see; 0 when there is no driver or no GPU (never throws, and clears the error that
/// cudaGetDeviceCount leaves behind, so that a later check_last_launch does not report it).
[[nodiscard]] int device_count() noexcept;

/// True if at least one GPU is visible.
[[nodiscard]] bool available() noexcept;

/// Picks this rank's GPU: its rank among the ranks of `view` on the same host (MPI_COMM_TYPE_SHARED),
/// modulo the GPUs visible, so that the ranks of a host spread over its GPUs; makes it the current device
/// of the calling thread and returns it. Collective over `view`. Throws InvalidArgument when no GPU is
/// visible ("--device cuda needs a CUDA GPU"), CudaError if cudaSetDevice fails.
int select_device(MPI_Comm view);

/// One line about a device: "0: NVIDIA H200, compute capability 9.0, 132 SMs, 139.8 GiB".
[[nodiscard]] std::string describe(int device);

}  // namespace sinew::cuda
