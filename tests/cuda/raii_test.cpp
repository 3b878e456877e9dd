// The CUDA RAII layer: checked calls and their messages (no GPU needed), streams, events, buffers and the
// cuBLAS handle (GPU).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gpu.hpp"
#include "sinew/core/error.hpp"
#include "sinew/cuda/blas.hpp"
#include "sinew/cuda/buffer.hpp"
#include "sinew/cuda/check.hpp"
#include "sinew/cuda/device.hpp"
#include "sinew/cuda/event.hpp"
#include "sinew/cuda/stream.hpp"

namespace sinew::cuda {
namespace {

TEST(CudaCheck, ErrorNamesTheCallTheErrorAndTheSite) {
  try {
    SINEW_CUDA(cudaErrorInvalidValue);
    FAIL() << "no throw";
  } catch (const CudaError& e) {
    const std::string what = e.message();
    EXPECT_NE(what.find("cudaErrorInvalidValue"), std::string::npos) << what;
    EXPECT_NE(what.find("failed"), std::string::npos) << what;
    EXPECT_NE(std::string(e.where().file_name()).find("raii_test.cpp"), std::string::npos);
    EXPECT_EQ(e.exit_code(), ExitCode::kFailure);
  }
  EXPECT_NO_THROW(SINEW_CUDA(cudaSuccess));
}

TEST(CudaCheck, CublasStatusIsNamed) {
  try {
    SINEW_CUBLAS(CUBLAS_STATUS_INVALID_VALUE);
    FAIL() << "no throw";
  } catch (const CudaError& e) {
    EXPECT_NE(e.message().find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << e.message();
  }
  EXPECT_NO_THROW(SINEW_CUBLAS(CUBLAS_STATUS_SUCCESS));
}

TEST(CudaDevice, CountNeverThrows) {
  // 0 on a machine without a driver or GPU, the number of GPUs otherwise.
  const int n = device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(available(), n > 0);
  // With a GPU, nothing lingers in the last-error slot for the next launch check. (Without a driver the
  // runtime's initialisation error stays there for good; no kernel is launched then.)
  if (n > 0) {
    EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess);
  }
}

TEST(CudaDevice, DescribeNamesTheGpu) {
  SINEW_REQUIRE_GPU();
  const std::string d = describe(0);
  EXPECT_NE(d.find("SMs"), std::string::npos) << d;
  EXPECT_NE(d.find("GiB"), std::string::npos) << d;
  EXPECT_THROW((void)describe(device_count() + 7), CudaError);
}

TEST(CudaRaii, BufferRoundTripZeroAndMove) {
  SINEW_REQUIRE_GPU();
  Stream stream;
  std::vector<float> host(1000);
  std::iota(host.begin(), host.end(), -3.5f);
  DeviceBuffer<float> buf(host.size());
  EXPECT_EQ(buf.size(), host.size());
  buf.upload(std::span<const float>(host), stream.get());
  std::vector<float> back(host.size(), 0.f);
  buf.download(back, stream.get());
  stream.synchronize();
  EXPECT_EQ(back, host);

  // Partial copies at an offset, and the bounds check.
  const std::vector<float> part{1.f, 2.f, 3.f};
  buf.upload(std::span<const float>(part), stream.get(), 997);
  std::vector<float> tail(3);
  buf.download(tail, stream.get(), 997);
  stream.synchronize();
  EXPECT_EQ(tail, part);
  EXPECT_THROW(buf.upload(std::span<const float>(part), stream.get(), 998), InvalidArgument);
  EXPECT_THROW(buf.download(tail, stream.get(), 1001), InvalidArgument);

  DeviceBuffer<float> moved(std::move(buf));
  EXPECT_EQ(buf.size(), 0u);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
  EXPECT_EQ(buf.data(), nullptr);
  moved.zero(stream.get());
  moved.download(back, stream.get());
  stream.synchronize();
  EXPECT_EQ(back, std::vector<float>(host.size(), 0.f));

  DeviceBuffer<std::int32_t> empty(0);
  EXPECT_TRUE(empty.empty());
  empty.zero(stream.get());  // nothing to do, no error
}

TEST(CudaRaii, PinnedBufferAsyncCopyAndEvent) {
  SINEW_REQUIRE_GPU();
  Stream stream;
  PinnedBuffer<double> pinned(4);
  for (std::size_t i = 0; i < 4; ++i) pinned[i] = static_cast<double>(i) + 0.25;
  DeviceBuffer<double> dev(4);
  dev.upload(std::span<const double>(pinned.data(), 4), stream.get());
  PinnedBuffer<double> back(4);
  dev.download(back.span(), stream.get());
  Event done;
  done.record(stream.get());
  done.synchronize();
  EXPECT_TRUE(done.query());
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(back[i], pinned[i]);

  Event never_recorded;
  EXPECT_TRUE(never_recorded.query());
  Event moved(std::move(never_recorded));
  EXPECT_EQ(never_recorded.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  EXPECT_NE(moved.get(), nullptr);
  Stream other(std::move(stream));
  EXPECT_EQ(stream.get(), nullptr);  // NOLINT(bugprone-use-after-move)
  other.synchronize();
}

TEST(CudaRaii, BlasHandleRunsOnItsStreamInFp32) {
  SINEW_REQUIRE_GPU();
  Stream stream;
  Blas blas(stream.get());
  cublasMath_t mode{};
  SINEW_CUBLAS(cublasGetMathMode(blas.get(), &mode));
  EXPECT_EQ(mode, CUBLAS_PEDANTIC_MATH);
  cudaStream_t bound = nullptr;
  SINEW_CUBLAS(cublasGetStream(blas.get(), &bound));
  EXPECT_EQ(bound, stream.get());

  // C (2x2) = A (2x3) * B (3x2), column-major.
  const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{1, 0, 2, 0, 1, 1};
  DeviceBuffer<float> da(6), db(6), dc(4);
  da.upload(std::span<const float>(a), stream.get());
  db.upload(std::span<const float>(b), stream.get());
  const float one = 1.f, zero = 0.f;
  SINEW_CUBLAS(cublasSgemm(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, da.data(), 2, db.data(), 3,
                           &zero, dc.data(), 2));
  std::vector<float> c(4);
  dc.download(c, stream.get());
  stream.synchronize();
  // Column 0 of B is (1, 0, 2): A's columns 0 + 2*2 = (1+10, 2+12); column 1 is (0, 1, 1): (3+5, 4+6).
  EXPECT_EQ(c, (std::vector<float>{11, 14, 8, 10}));
}

TEST(CudaRaii, AnErrorIsReportedOnceNotAgainByTheNextLaunchCheck) {
  SINEW_REQUIRE_GPU();
  EXPECT_THROW(SINEW_CUDA(cudaSetDevice(device_count() + 3)), CudaError);
  EXPECT_NO_THROW(check_last_launch("nothing"));
  SINEW_CUDA(cudaSetDevice(0));
}

}  // namespace
}  // namespace sinew::cuda
