#include "sinew/cuda/device.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <string>

#include "sinew/core/error.hpp"
#include "sinew/cuda/check.hpp"
#include "sinew/mpi/check.hpp"

namespace sinew::cuda {

namespace {

/// cudaGetDeviceCount's status, with the count when it succeeds.
cudaError_t query_count(int& count) noexcept {
  count = 0;
  const cudaError_t code = cudaGetDeviceCount(&count);
  if (code != cudaSuccess) {
    count = 0;
    // Not a sticky error, but it stays in the thread's last-error slot, where check_last_launch would
    // report it after an unrelated kernel launch.
    (void)cudaGetLastError();
  }
  return code;
}

}  // namespace

int device_count() noexcept {
  int count = 0;
  (void)query_count(count);
  return count;
}

bool available() noexcept { return device_count() > 0; }

int select_device(MPI_Comm view) {
  int count = 0;
  const cudaError_t code = query_count(count);
  if (count <= 0) {
    const std::string why = code == cudaSuccess
                                ? std::string("0 devices")
                                : fmt::format("{}: {}", cudaGetErrorName(code), cudaGetErrorString(code));
    SINEW_THROW(InvalidArgument, "--device cuda needs a CUDA GPU; none is visible (cudaGetDeviceCount: {})",
                why);
  }
  int rank = 0;
  SINEW_MPI(MPI_Comm_rank(view, &rank));
  MPI_Comm local = MPI_COMM_NULL;
  SINEW_MPI(MPI_Comm_split_type(view, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local));
  int local_rank = 0;
  const int rank_code = MPI_Comm_rank(local, &local_rank);
  // Freed before checking, so that a failed MPI_Comm_rank does not leak the communicator.
  const int free_code = MPI_Comm_free(&local);
  SINEW_MPI(rank_code);
  SINEW_MPI(free_code);
  const int device = local_rank % count;
  SINEW_CUDA(cudaSetDevice(device));
  return device;
}

std::string describe(int device) {
  cudaDeviceProp prop{};
  SINEW_CUDA(cudaGetDeviceProperties(&prop, device));
  return fmt::format("{}: {}, compute capability {}.{}, {} SMs, {:.1f} GiB", device, prop.name, prop.major,
                     prop.minor, prop.multiProcessorCount,
                     static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
}

}  // namespace sinew::cuda
