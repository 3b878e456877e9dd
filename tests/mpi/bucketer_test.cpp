// Bucketed, overlapped gradient allreduce gives exactly what one MPI_Allreduce gives.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <numeric>
#include <span>
#include <thread>
#include <vector>

#include "sinew/comm/bucketer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/mpi/environment.hpp"

using namespace sinew;

namespace {
/// Ranges as backward reports them: the last "layer" first, with uneven sizes.
std::vector<Slice> layer_ranges(const std::vector<std::size_t>& sizes) {
  std::vector<Slice> out;
  std::size_t end = 0;
  for (auto s : sizes) end += s;
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    end -= *it;
    out.push_back({end, *it});
  }
  return out;
}

void check_matches_mpi(std::size_t bucket_bytes, bool overlap) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const std::vector<std::size_t> sizes = {7, 3000, 1, 50000, 129, 20000, 10};
  std::size_t total = 0;
  for (auto s : sizes) total += s;
  std::vector<float> grads(total), expect(total);
  const auto ranges = layer_ranges(sizes);
  comm::BucketOptions o;
  o.bucket_bytes = bucket_bytes;
  o.overlap = overlap;
  comm::GradientBucketer bucketer(backend, grads, ranges, o);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < total; ++i) {
      grads[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i) * (backend.rank() + 1) + step));
    }
    MPI_Allreduce(grads.data(), expect.data(), static_cast<int>(total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (const auto& r : ranges) bucketer.mark_ready(r);
    bucketer.finish();
    for (std::size_t i = 0; i < total; ++i) {
      // Different reduction trees may round differently: allow a few ulps of the magnitude.
      ASSERT_NEAR(grads[i], expect[i], 1e-5f * static_cast<float>(backend.size()))
          << "element " << i << " step " << step;
    }
  }
  if (bucket_bytes <= 4096) {
    EXPECT_GT(bucketer.num_buckets(), 3u);
  }
  // Buckets are contiguous, in backward order, and cover the buffer once.
  std::size_t covered = 0, expected_end = total;
  for (const auto& b : bucketer.buckets()) {
    EXPECT_EQ(b.offset + b.count, expected_end);
    expected_end = b.offset;
    covered += b.count;
  }
  EXPECT_EQ(covered, total);
}
}  // namespace

// Layers of mixed sizes, gradients of one, in 4 KiB buckets (many of them): what the in-order tests hand
// collectives between.
struct MixedLayers {
  static constexpr std::size_t kSizes[] = {7, 3000, 1, 50000, 129, 20000, 10};
  std::size_t total = std::accumulate(std::begin(kSizes), std::end(kSizes), std::size_t{0});
  std::vector<float> grads = std::vector<float>(total, 1.f);
  std::vector<Slice> ranges = layer_ranges({std::begin(kSizes), std::end(kSizes)});

  static comm::BucketOptions small_buckets(std::size_t backlog) {
    comm::BucketOptions o;
    o.bucket_bytes = 4096;
    o.max_backlog = backlog;
    return o;
  }
};

TEST(Bucketer, MatchesMpiAllreduceManySmallBuckets) { check_matches_mpi(4096, true); }

// Collectives handed to the bucketer between the ranges' arrivals (--shard parameters' gathers inside
// backward) run in the same place among the buckets' reductions on every rank: the sums are right, nothing
// hangs, and with a backlog of one bucket backward waits for the communication thread instead.
TEST(Bucketer, RunsCollectivesInOrderBetweenBuckets) {
  for (const std::size_t backlog : {std::size_t{0}, std::size_t{1}}) {
    comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
    MixedLayers m;
    auto& [total, grads, ranges] = m;
    comm::GradientBucketer bucketer(backend, grads, ranges, MixedLayers::small_buckets(backlog));
    std::vector<double> sums;
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      bucketer.mark_ready(ranges[k]);
      if (k % 2 == 0) {
        bucketer.run_in_order([&] {
          double x[1] = {static_cast<double>(k + 1)};
          backend.allreduce_sync(comm::Buffer::of(std::span<double>(x)), comm::ReduceOp::kSum,
                                 comm::Options{});
          sums.push_back(x[0]);
        });
      }
    }
    bucketer.finish();
    const auto n = static_cast<double>(backend.size());
    for (std::size_t j = 0; j < sums.size(); ++j) EXPECT_EQ(sums[j], n * static_cast<double>(2 * j + 1));
    for (std::size_t i = 0; i < total; ++i) ASSERT_EQ(grads[i], static_cast<float>(backend.size())) << i;
  }
}
// A collective handed over without waiting (the prefetch of a unit's gather) runs in its place among the
// buckets too, whenever it is waited for; one not started yet is cancelled (a recovery), one running is let
// finish.
TEST(Bucketer, PostedCollectivesRunInOrderAndCancelLeavesTheRest) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  MixedLayers m;
  auto& [total, grads, ranges] = m;
  comm::GradientBucketer bucketer(backend, grads, ranges, MixedLayers::small_buckets(0));
  std::vector<double> sums(ranges.size());
  std::vector<comm::Bucketer::Ticket> posted;
  for (std::size_t k = 0; k < ranges.size(); ++k) {
    bucketer.mark_ready(ranges[k]);
    posted.push_back(bucketer.post_in_order([&, k] {
      double x[1] = {static_cast<double>(k + 1)};
      backend.allreduce_sync(comm::Buffer::of(std::span<double>(x)), comm::ReduceOp::kSum, comm::Options{});
      sums[k] = x[0];
    }));
    if (k % 3 == 2) bucketer.wait_in_order(posted[k - 1]);  // waited for late, some never waited for here
  }
  bucketer.wait_in_order(posted.back());  // the last: all before it have run
  bucketer.finish();
  const auto n = static_cast<double>(backend.size());
  for (std::size_t k = 0; k < sums.size(); ++k) EXPECT_EQ(sums[k], n * static_cast<double>(k + 1)) << k;
  for (std::size_t i = 0; i < total; ++i) ASSERT_EQ(grads[i], static_cast<float>(backend.size())) << i;

  std::atomic<bool> go{false};
  std::atomic<bool> running{false};
  bool second_ran = false;
  const auto first = bucketer.post_in_order([&] {
    running = true;
    while (!go.load()) std::this_thread::yield();
  });
  while (!running.load()) std::this_thread::yield();
  const auto second = bucketer.post_in_order([&] { second_ran = true; });
  bucketer.cancel_in_order(second);  // queued behind the first, which is running: it never runs
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    go = true;
  });
  bucketer.cancel_in_order(first);  // running: returns once it is done
  EXPECT_TRUE(go.load());
  later.join();
  EXPECT_NO_THROW(bucketer.wait_in_order(first));
  EXPECT_FALSE(second_ran);
}
TEST(Bucketer, MatchesMpiAllreduceOneBigBucket) { check_matches_mpi(64u << 20, true); }
TEST(Bucketer, MatchesMpiAllreduceWithoutOverlap) { check_matches_mpi(16384, false); }

TEST(Bucketer, RejectsRangesThatDoNotCoverTheBuffer) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  std::vector<float> g(100);
  EXPECT_THROW(comm::GradientBucketer(backend, g, {{50, 50}}, {}), InvalidArgument);
  EXPECT_THROW(comm::GradientBucketer(backend, g, {{50, 60}, {0, 50}}, {}), InvalidArgument);
  comm::GradientBucketer ok(backend, g, {{50, 50}, {0, 50}}, {});
  EXPECT_THROW(ok.mark_ready({10, 5}), InvalidArgument);
}

TEST(Bucketer, LateRankMakesFinishWaitNotFail) {
  // One rank reports its gradients later than the others (a slow backward): the others wait in finish()
  // and everyone gets the full sum.
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  std::vector<float> g(1000, 1.f);
  comm::GradientBucketer b(backend, g, layer_ranges({500, 500}), {});
  if (backend.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (const auto& r : layer_ranges({500, 500})) b.mark_ready(r);
  b.finish();
  for (float x : g) ASSERT_EQ(x, static_cast<float>(backend.size()));
}

TEST(Bucketer, MissingPeerGivesTimeoutNotHang) {
  // Rank 0 gives up at its deadline and aborts the backend; with ULFM that revokes the communicator, so
  // the late rank's allreduce fails promptly instead of hanging. Without ULFM nothing could interrupt the
  // late rank's collective, so the scenario needs ULFM.
  if (!mpi::ulfm_enabled()) GTEST_SKIP() << "needs ULFM (mpirun --with-ft ulfm)";
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  std::vector<float> g(1000, 1.f);
  const auto ranges = layer_ranges({500, 500});
  comm::BucketOptions o;
  o.op.timeout = std::chrono::milliseconds(300);
  comm::GradientBucketer b(backend, g, ranges, o);
  if (backend.rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  for (const auto& r : ranges) b.mark_ready(r);
  const auto t0 = std::chrono::steady_clock::now();
  if (backend.rank() == 0) {
    EXPECT_THROW(b.finish(), Timeout);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  } else {
    // ULFM does not make errors uniform: this rank's allreduce may still complete with the data rank 0
    // sent before it gave up, or fail as revoked. It must not hang, and the group is unusable after.
    try {
      b.finish();
    } catch (const CommFailure&) {
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the revoke notice arrive
    EXPECT_THROW(backend.barrier_sync(), CommFailure);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
