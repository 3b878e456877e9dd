// The NCCL backend on a real GPU with the real NCCL (opened at run time): one process, run alone and under
// mpirun -n 1. Exits 77 (ctest: skipped) where there is no GPU or no NCCL. The multi-rank protocol is
// tested without a GPU in nccl_backend_test.cpp; this checks that the same code drives the real library:
// non-blocking bootstrap, operations on device memory, events from another stream, abort and rebuild.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "sinew/comm/mpi/backend.hpp"
#include "sinew/comm/nccl/api.hpp"
#include "sinew/comm/nccl/backend.hpp"
#include "sinew/comm/nccl/bucketer.hpp"
#include "sinew/comm/nccl/bytegrad.hpp"
#include "sinew/core/error.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/mpi/environment.hpp"

using namespace sinew;
using comm::Buffer;
using comm::DType;
using comm::ReduceOp;
using comm::nccl::NcclBackend;

namespace {

constexpr int kSkipped = 77;

/// Device memory for a test, freed on scope exit.
class DeviceFloats {
 public:
  explicit DeviceFloats(std::size_t n) : n_(n) { EXPECT_EQ(cudaMalloc(&p_, n * sizeof(float)), cudaSuccess); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  DeviceFloats(DeviceFloats&&) = delete;
  DeviceFloats& operator=(DeviceFloats&&) = delete;
  ~DeviceFloats() { cudaFree(p_); }
  [[nodiscard]] float* get() const { return static_cast<float*>(p_); }
  void put(const std::vector<float>& v) const {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  [[nodiscard]] std::vector<float> get_host() const {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_;
};

struct World {
  mpi::Communicator comm = mpi::Communicator::borrow(MPI_COMM_WORLD).dup();
  comm::mpi::MpiBackend view{comm};
};

TEST(NcclGpu, BootstrapAndCollectivesOnDeviceMemory) {
  World w;
  NcclBackend nccl(w.view, comm::nccl::real_api());
  std::printf("NCCL init of %d rank(s): %.1f ms (%s)\n", nccl.size(), nccl.init_ms(),
              nccl.api().describe().c_str());
  const std::size_t n = 1 << 16;
  DeviceFloats x(n);
  std::vector<float> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(i % 1000) * 0.5F;
  x.put(h);
  nccl.allreduce_sync(Buffer{x.get(), n, DType::kFloat32}, ReduceOp::kSum);
  std::vector<float> expect = h;
  for (auto& v : expect) v *= static_cast<float>(nccl.size());
  EXPECT_EQ(x.get_host(), expect);
  nccl.broadcast_sync(Buffer{x.get(), n, DType::kFloat32}, 0);
  DeviceFloats all(n * static_cast<std::size_t>(nccl.size()));
  nccl.allgather_sync(Buffer{x.get(), n, DType::kFloat32},
                      Buffer{all.get(), n * static_cast<std::size_t>(nccl.size()), DType::kFloat32});
  EXPECT_EQ(all.get_host(), expect);
  DeviceFloats y(n);
  nccl.all_to_all(Buffer{x.get(), n, DType::kFloat32}, Buffer{y.get(), n, DType::kFloat32}, {})
      ->wait(std::chrono::seconds(30));
  EXPECT_EQ(y.get_host(), expect);
  nccl.barrier_sync();
  nccl.allreduce_blocking(Buffer{x.get(), n, DType::kFloat32}, ReduceOp::kMax);
}

TEST(NcclGpu, BucketerWaitsForEventsOfAnotherStream) {
  World w;
  NcclBackend nccl(w.view, comm::nccl::real_api());
  const std::size_t n = 4096;
  DeviceFloats grads(n);
  cudaStream_t compute = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  std::vector<cudaEvent_t> events(4);
  for (auto& e : events) ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  const std::vector<Slice> backward{{3072, 1024}, {2048, 1024}, {1024, 1024}, {0, 1024}};
  comm::nccl::DeviceBucketOptions o;
  o.bucket_bytes = 2048 * sizeof(float);
  comm::nccl::ByteGrad bytegrad(nccl, n, 256);
  for (const bool compressed : {false, true}) {
    if (compressed) o.reduce = [&](float* d, std::size_t c, std::size_t) { return bytegrad.reduce(d, c); };
    comm::nccl::DeviceBucketer bucketer(nccl, grads.get(), n, backward, o);
    EXPECT_EQ(bucketer.num_buckets(), 2u);
    std::vector<float> h(n);
    for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<float>(i);
    // "Backward": each range written on the compute stream, then its event recorded there.
    for (std::size_t i = 0; i < backward.size(); ++i) {
      const auto& r = backward[i];
      ASSERT_EQ(cudaMemcpyAsync(grads.get() + r.offset, h.data() + r.offset, r.count * sizeof(float),
                                cudaMemcpyHostToDevice, compute),
                cudaSuccess);
      ASSERT_EQ(cudaEventRecord(events[i], compute), cudaSuccess);
      bucketer.mark_ready(r, events[i]);
    }
    bucketer.finish();
    for (auto& v : h) v *= static_cast<float>(nccl.size());
    EXPECT_EQ(grads.get_host(), h);
  }
  for (auto& e : events) cudaEventDestroy(e);
  cudaStreamDestroy(compute);
}

TEST(NcclGpu, AbortThenRebuild) {
  World w;
  DeviceFloats x(1024);
  x.put(std::vector<float>(1024, 1.0F));
  {
    NcclBackend nccl(w.view, comm::nccl::real_api());
    nccl.allreduce_sync(Buffer{x.get(), 1024, DType::kFloat32}, ReduceOp::kSum);
    nccl.abort();
    nccl.abort();
    EXPECT_THROW(nccl.allreduce(Buffer{x.get(), 1024, DType::kFloat32}, ReduceOp::kSum, {}), CommFailure);
  }
  NcclBackend again(w.view, comm::nccl::real_api());
  x.put(std::vector<float>(1024, 2.0F));
  again.allreduce_sync(Buffer{x.get(), 1024, DType::kFloat32}, ReduceOp::kSum);
  EXPECT_EQ(x.get_host(), std::vector<float>(1024, 2.0F * static_cast<float>(again.size())));
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  mpi::Environment env(&argc, &argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("[nccl_gpu_test] skipped: no CUDA device\n");
    return kSkipped;
  }
  try {
    comm::nccl::real_api();
  } catch (const Error& e) {
    std::printf("[nccl_gpu_test] skipped: %s\n", e.message().c_str());
    return kSkipped;
  }
  if (env.world_size() != 1) {
    std::printf("[nccl_gpu_test] one process only (NCCL refuses two ranks on one GPU)\n");
    return 1;
  }
  return RUN_ALL_TESTS();
}
