// A build without CUDA: --device cuda is refused where the fabric is built (train/gpu_fabric.hpp).
#include "sinew/train/gpu_fabric.hpp"
#include "sinew/core/error.hpp"

namespace sinew::train {

std::unique_ptr<GpuFabric> make_gpu_fabric(comm::mpi::MpiBackend& /*view*/, comm::nccl::Api* /*api*/,
                                           const comm::Options& /*op*/) {
  SINEW_THROW(InvalidArgument, "--device cuda: this build of Sinew has no GPU support; use --device cpu");
}

}  // namespace sinew::train
