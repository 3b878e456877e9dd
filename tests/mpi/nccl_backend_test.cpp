// The NCCL backend without a GPU: over 2-4 MPI ranks with the fake NCCL (nccl_fake.hpp), which runs
// the real protocol over shared memory. Bootstrap and collectives, the overlap of DeviceBucketer (events ->
// buckets, in order), and, with ULFM, a rank killed inside an NCCL collective: the survivors must get a
// CommFailure within milliseconds (not at the 300 s deadline), abort NCCL, shrink the group and rebuild,
// leaking no communicator and never calling one after its abort; and a rebuild after growth.
//
// Own main() as membership_test.cpp: a process started by Group::grow() runs this program with
// --spawned-member and takes part in the new view's NCCL bootstrap; the killing tests run one per job
// (ALONE in tests/mpi/CMakeLists.txt) and the verdict is reduced over the survivors.
#include <gtest/gtest.h>
#include <mpi.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_main.hpp"
#include "nccl_fake.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/comm/nccl/backend.hpp"
#include "sinew/comm/nccl/bucketer.hpp"
#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/mpi/environment.hpp"

using namespace sinew;
using comm::Backend;
using comm::Buffer;
using comm::DType;
using comm::ReduceOp;
using comm::mpi::MpiBackend;
using comm::nccl::DeviceBucketer;
using comm::nccl::DeviceBucketOptions;
using comm::nccl::FakeApi;
using comm::nccl::NcclBackend;
using membership::Group;
using membership::SpawnCommand;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kSpawnedMemberFlag = "--spawned-member";
constexpr const char* kNeedsUlfm = "needs ULFM (Open MPI 5 and mpirun --with-ft ulfm)";

SpawnCommand g_self;
std::unique_ptr<mpi::Communicator> g_live;  // the members still alive (replaced after a shrink)
const mpi::Communicator& live() { return *g_live; }

/// Ends the process if a scope is not left in time: a hang fails at once, with a line naming it.
class Deadline {
 public:
  Deadline(std::chrono::seconds limit, std::string what)
      : what_(std::move(what)), thread_([this, limit] { watch(limit); }) {}
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;
  Deadline(Deadline&&) = delete;
  Deadline& operator=(Deadline&&) = delete;
  ~Deadline() {
    {
      const std::lock_guard lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void watch(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
    std::fprintf(stderr, "[nccl_backend_test] DEADLINE: %s did not finish within %lld s; exiting\n",
                 what_.c_str(), static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(124);  // not MPI_Abort: under ULFM it left the job hanging (membership_test.cpp)
  }
  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::string test_name() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return info != nullptr ? std::string(info->test_suite_name()) + "." + info->name() : "spawned member";
}

bool segment_exists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

/// Nothing of `api` left: no communicator, stream or event alive, no call after an abort, every segment
/// unlinked. Call after every rank destroyed its backends (a barrier on the view in between).
void expect_clean(const FakeApi& api) {
  EXPECT_EQ(api.live_comms(), 0);
  EXPECT_EQ(api.live_streams(), 0);
  EXPECT_EQ(api.live_events(), 0);
  EXPECT_TRUE(api.misuse().empty()) << api.misuse().front();
  for (const auto& name : api.segment_names()) EXPECT_FALSE(segment_exists(name)) << name;
}

// ---- bootstrap and collectives --------------------------------------------------------------------------

TEST(NcclFake, BootstrapAndCollectives) {
  const Deadline deadline(std::chrono::seconds(30), test_name());
  const auto group = Group::over(live());
  MpiBackend view(group.comm());
  FakeApi api;
  const int n = view.size(), me = view.rank();
  const auto nu = static_cast<std::size_t>(n);
  {
    NcclBackend nccl(view, api);
    EXPECT_EQ(nccl.name(), "nccl");
    EXPECT_EQ(nccl.rank(), me);
    EXPECT_EQ(nccl.size(), n);
    EXPECT_GE(nccl.init_ms(), 0.0);
    EXPECT_EQ(api.live_comms(), 1);

    std::vector<float> f(1000);
    for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(me + 1) * static_cast<float>(i);
    nccl.allreduce_sync(Buffer::of(std::span(f)), ReduceOp::kSum);
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < f.size(); ++i) ASSERT_FLOAT_EQ(f[i], ranks_sum * static_cast<float>(i)) << i;

    std::vector<double> d{static_cast<double>(me), -static_cast<double>(me)};
    nccl.allreduce_sync(Buffer::of(std::span(d)), ReduceOp::kMax);
    EXPECT_EQ(d, (std::vector<double>{n - 1.0, 0.0}));
    std::vector<std::int32_t> k{me + 5, 7};
    nccl.allreduce_sync(Buffer::of(std::span(k)), ReduceOp::kMin);
    EXPECT_EQ(k, (std::vector<std::int32_t>{5, 7}));
    nccl.allreduce_blocking(Buffer::of(std::span(k)), ReduceOp::kSum);
    EXPECT_EQ(k, (std::vector<std::int32_t>{5 * n, 7 * n}));

    std::vector<std::int64_t> b(3, me == n - 1 ? 42 : -1);
    nccl.broadcast_sync(Buffer::of(std::span(b)), n - 1);
    EXPECT_EQ(b, std::vector<std::int64_t>(3, 42));

    std::vector<std::int32_t> mine{me, 10 * me};
    std::vector<std::int32_t> all(2 * nu, -1);
    nccl.allgather_sync(Buffer::of(std::span(mine)), Buffer::of(std::span(all)));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(all[2 * static_cast<std::size_t>(r)], r);
      EXPECT_EQ(all[2 * static_cast<std::size_t>(r) + 1], 10 * r);
    }

    // all_to_all: segment k of rank r holds 100 r + k; afterwards segment k holds 100 k + r.
    std::vector<std::int32_t> in(2 * nu), out(2 * nu, -1);
    for (std::size_t s = 0; s < nu; ++s) in[2 * s] = in[2 * s + 1] = 100 * me + static_cast<int>(s);
    nccl.all_to_all(Buffer::of(std::span(in)), Buffer::of(std::span(out)), {})
        ->wait(std::chrono::seconds(10));
    for (std::size_t s = 0; s < nu; ++s) {
      EXPECT_EQ(out[2 * s], 100 * static_cast<int>(s) + me);
      EXPECT_EQ(out[2 * s + 1], 100 * static_cast<int>(s) + me);
    }

    // Point-to-point: rank 0 sends to every other rank in turn (one-way messages, which NCCL cannot
    // deadlock on one stream; exchanges go through all_to_all).
    for (int peer = 1; peer < n; ++peer) {
      std::vector<float> msg(4, me == 0 ? static_cast<float>(peer) : -1.0F);
      if (me == 0) nccl.send(Buffer::of(std::span(msg)), peer, {})->wait(std::chrono::seconds(10));
      if (me == peer) {
        nccl.recv(Buffer::of(std::span(msg)), 0, {})->wait(std::chrono::seconds(10));
        EXPECT_EQ(msg, std::vector<float>(4, static_cast<float>(peer)));
      }
    }

    nccl.barrier_sync();
    // Mismatched shapes are refused before anything is enqueued.
    EXPECT_THROW(nccl.allgather(Buffer::of(std::span(mine)), Buffer::of(std::span(mine)), {}),
                 InvalidArgument);
    EXPECT_THROW(nccl.broadcast(Buffer::of(std::span(b)), n, {}), InvalidArgument);
  }
  view.barrier_sync();  // every rank destroyed its communicator: the segment is unlinked
  expect_clean(api);
  EXPECT_EQ(api.comms_aborted(), 0);  // the destructor finalized and destroyed it
}

// The collectives of sharded state (train/shards.hpp) over NCCL: the reduce-scatter of a gradient bucket to
// the shards' owners and the all-gather of the parameters' shards, for blocks of equal counts (NCCL's own
// collectives) and for uneven ones with an empty block (a group of ncclReduce / ncclBroadcast per block).
TEST(NcclFake, ReduceScatterAndAllgatherOfShards) {
  const Deadline deadline(std::chrono::seconds(30), test_name());
  const auto group = Group::over(live());
  MpiBackend view(group.comm());
  FakeApi api;
  const int n = view.size(), me = view.rank();
  const auto nu = static_cast<std::size_t>(n);
  const auto mu = static_cast<std::size_t>(me);
  const int sum_of_ranks = n * (n + 1) / 2;  // 1 + 2 + ... + n: exact
  const auto ranks_sum = static_cast<float>(sum_of_ranks);
  {
    NcclBackend nccl(view, api);
    const auto ops = [&] {
      std::vector<std::string> out;
      for (const auto& e : api.journal()) out.push_back(e.op);
      api.clear_journal();
      return out;
    };
    const auto offset_of = [](const std::vector<std::size_t>& counts, std::size_t k) {
      return std::accumulate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(k), std::size_t{0});
    };
    // Element i of rank r's input is (r + 1) i: the reduction of element i is ranks_sum * i.
    for (const bool uneven : {false, true}) {
      std::vector<std::size_t> counts(nu, 3);
      if (uneven) {
        for (std::size_t k = 0; k < nu; ++k) counts[k] = k;  // block 0 empty, the others 1, 2, ...
      }
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      std::vector<float> in(total);
      for (std::size_t i = 0; i < total; ++i) in[i] = static_cast<float>(me + 1) * static_cast<float>(i);
      const std::vector<float> kept = in;
      std::vector<float> out(counts[mu], -1.F);
      api.clear_journal();
      nccl.reduce_scatter(Buffer::of(std::span(in)), Buffer::of(std::span(out)), counts, ReduceOp::kSum, {})
          ->wait(std::chrono::seconds(10));
      const std::size_t at = offset_of(counts, mu);
      for (std::size_t j = 0; j < out.size(); ++j)
        ASSERT_FLOAT_EQ(out[j], ranks_sum * static_cast<float>(at + j)) << "uneven " << uneven << " at " << j;
      EXPECT_EQ(in, kept);  // the input is not written
      EXPECT_EQ(ops(), uneven ? std::vector<std::string>(nu - 1, "reduce")
                              : std::vector<std::string>{"reduce_scatter"});

      // All-gather in place: each rank holds only its own block (100 r + j), the rest -1.
      std::vector<std::int32_t> buf(total, -1);
      for (std::size_t j = 0; j < counts[mu]; ++j) buf[at + j] = 100 * me + static_cast<int>(j);
      nccl.allgather_v(Buffer::of(std::span(buf)), counts, {})->wait(std::chrono::seconds(10));
      for (std::size_t k = 0; k < nu; ++k) {
        for (std::size_t j = 0; j < counts[k]; ++j)
          ASSERT_EQ(buf[offset_of(counts, k) + j], 100 * static_cast<int>(k) + static_cast<int>(j)) << k << j;
      }
      EXPECT_EQ(ops(), uneven ? std::vector<std::string>(nu - 1, "broadcast")
                              : std::vector<std::string>{"allgather"});
    }
    // Counts that do not cut the buffer into one block per rank are refused before anything is enqueued.
    std::vector<float> x(4 * nu), y(4);
    const std::vector<std::size_t> short_counts(nu - 1, 4), long_counts(nu, 5);
    EXPECT_THROW(nccl.reduce_scatter(Buffer::of(std::span(x)), Buffer::of(std::span(y)), short_counts,
                                     ReduceOp::kSum, {}),
                 InvalidArgument);
    EXPECT_THROW(nccl.allgather_v(Buffer::of(std::span(x)), long_counts, {}), InvalidArgument);
    const std::vector<std::size_t> fours(nu, 4);
    std::vector<float> wrong(3);
    EXPECT_THROW(nccl.reduce_scatter(Buffer::of(std::span(x)), Buffer::of(std::span(wrong)), fours,
                                     ReduceOp::kSum, {}),
                 InvalidArgument);
    EXPECT_TRUE(api.journal().empty());
  }
  view.barrier_sync();
  expect_clean(api);
}

// Backend::exchange: every rank sends to both neighbours and receives from both, receives posted first (the
// order that deadlocks two plain ncclSend/ncclRecv sequences): one NCCL group, so it completes, with every
// message where it belongs. Backend::fill: a memset on the stream, after what was enqueued before it.
TEST(NcclFake, ExchangeIsOneGroupAndFillSetsEveryByte) {
  const Deadline deadline(std::chrono::seconds(30), test_name());
  const auto group = Group::over(live());
  MpiBackend view(group.comm());
  FakeApi api;
  const int n = view.size(), me = view.rank();
  {
    NcclBackend nccl(view, api);
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<float> to_next(5, static_cast<float>(me)), to_prev(3, static_cast<float>(-me));
    std::vector<float> from_prev(5, -7.F), from_next(3, -7.F);
    const std::vector<Backend::Message> sends{{Buffer::of(std::span(to_next)), next},
                                              {Buffer::of(std::span(to_prev)), prev}};
    const std::vector<Backend::Message> recvs{{Buffer::of(std::span(from_prev)), prev},
                                              {Buffer::of(std::span(from_next)), next}};
    api.clear_journal();
    nccl.exchange(sends, recvs, {})->wait(std::chrono::seconds(10));
    EXPECT_EQ(from_prev, std::vector<float>(5, static_cast<float>(prev)));
    EXPECT_EQ(from_next, std::vector<float>(3, static_cast<float>(-next)));
    std::set<int> groups;
    std::size_t p2p = 0;
    for (const auto& e : api.journal()) {
      if (e.kind != FakeApi::JournalEntry::Kind::kSend && e.kind != FakeApi::JournalEntry::Kind::kRecv)
        continue;
      ++p2p;
      groups.insert(e.group);
    }
    EXPECT_EQ(p2p, 4U);
    EXPECT_EQ(groups, std::set<int>{groups.empty() ? 0 : *groups.begin()}) << "all in one group";
    EXPECT_EQ(groups.count(0), 0U) << "not outside a group";
    EXPECT_EQ(nccl.exchange({}, {}, {}), nullptr) << "nothing to exchange";
    std::vector<Backend::Message> outside{{Buffer::of(std::span(to_next)), n}};
    EXPECT_THROW((void)nccl.exchange(outside, {}, {}), InvalidArgument);

    // NaN from 0xff bytes, after the allreduce enqueued before it (which would otherwise overwrite it).
    std::vector<float> v(6, 1.F);
    auto sum = nccl.allreduce(Buffer::of(std::span(v)), ReduceOp::kSum, {});
    auto fill = nccl.fill(Buffer::of(std::span(v).subspan(2, 3)), 0xff);
    fill->wait(std::chrono::seconds(10));
    sum->wait(std::chrono::seconds(10));
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i >= 2 && i < 5) {
        EXPECT_TRUE(std::isnan(v[i])) << i;
      } else {
        EXPECT_EQ(v[i], static_cast<float>(n)) << i;
      }
    }
  }
  view.barrier_sync();
  expect_clean(api);
}

TEST(NcclFake, AbortEndsPendingAndLaterOperations) {
  const Deadline deadline(std::chrono::seconds(30), test_name());
  const auto group = Group::over(live());
  MpiBackend view(group.comm());
  FakeApi api;
  {
    NcclBackend nccl(view, api);
    std::vector<float> x(8, 1.0F);
    // Only rank 0 enqueues: the collective cannot complete, and abort() from another thread ends the wait.
    if (view.rank() == 0) {
      auto w = nccl.allreduce(Buffer::of(std::span(x)), ReduceOp::kSum, {});
      std::thread aborter([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        nccl.abort();
      });
      const auto start = Clock::now();
      EXPECT_THROW(w->wait(std::chrono::seconds(60)), CommFailure);
      aborter.join();
      EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    } else {
      nccl.abort();
    }
    EXPECT_TRUE(nccl.aborted());
    EXPECT_THROW(nccl.allreduce(Buffer::of(std::span(x)), ReduceOp::kSum, {}), CommFailure);
    EXPECT_THROW(nccl.barrier({}), CommFailure);
    nccl.abort();  // idempotent
    EXPECT_EQ(api.comms_aborted(), 1);
  }
  view.barrier_sync();
  expect_clean(api);
}

TEST(NcclFake, InitPastTheDeadlineIsATimeoutAndLeavesNothing) {
  const Deadline deadline(std::chrono::seconds(30), test_name());
  const auto group = Group::over(live());
  MpiBackend view(group.comm());
  FakeApi api;
  // Every rank but the last bootstraps: their init waits for it until the deadline.
  const auto start = Clock::now();
  if (view.rank() != view.size() - 1) {
    try {
      NcclBackend nccl(view, api, comm::Options{std::chrono::milliseconds(300)});
      ADD_FAILURE() << "init without the last rank did not throw";
    } catch (const Timeout& e) {
      EXPECT_NE(std::string(e.what()).find("did not complete within 300 ms"), std::string::npos) << e.what();
    } catch (const CommFailure& e) {
      ADD_FAILURE() << "expected Timeout, got " << e.what();
    }
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(api.comms_aborted(), 1);
  } else {
    // The last rank takes part in the id's broadcast only (the MPI view's collective), not in NCCL's init.
    std::array<std::byte, sizeof(std::int32_t) + sizeof(ncclUniqueId)> msg{};
    view.broadcast_sync(Buffer{msg.data(), msg.size(), DType::kUInt8}, 0);
  }
  view.barrier_sync();
  EXPECT_EQ(api.live_comms(), 0);
  EXPECT_EQ(api.live_streams(), 0);
  EXPECT_TRUE(api.misuse().empty());
}

// ---- the overlap: events -> buckets ---------------------------------------------------------------------

TEST(NcclFake, BucketerEnqueuesBucketsInOrderAsEventsArrive) {
  const Deadline deadline(std::chrono::seconds(30), test_name());
  const auto group = Group::over(live());
  MpiBackend view(group.comm());
  FakeApi api;
  const int n = view.size(), me = view.rank();
  {
    // The gradients outlive the backend: its destructor completes what is still enqueued on them (the
    // incomplete step at the end), as a fabric's device gradients outlive its NCCL backend.
    std::vector<float> grads(40);
    NcclBackend nccl(view, api);
    // Four layers of 10, 6, 4, 20 floats; backward reports the last layer first. With buckets of 16 floats
    // (comm::GradientBucketer's rules: ranges are merged while the bucket is below the target) that makes
    // {layer 3} alone (20 floats), then layers 2, 1, 0 (4 + 6 + 10 floats).
    const std::vector<Slice> forward{{0, 10}, {10, 6}, {16, 4}, {20, 20}};
    std::vector<Slice> backward(forward.rbegin(), forward.rend());
    DeviceBucketOptions o;
    o.bucket_bytes = 16 * sizeof(float);
    o.op.timeout = std::chrono::seconds(20);
    DeviceBucketer bucketer(nccl, grads.data(), grads.size(), backward, o);
    const auto buckets = bucketer.buckets();
    ASSERT_EQ(bucketer.num_buckets(), 2u);
    EXPECT_EQ(buckets[0].offset, 20u);
    EXPECT_EQ(buckets[0].count, 20u);
    EXPECT_EQ(buckets[1].offset, 0u);
    EXPECT_EQ(buckets[1].count, 20u);

    cudaStream_t compute = nullptr;
    ASSERT_EQ(api.stream_create(&compute), cudaSuccess);
    std::vector<cudaEvent_t> events(backward.size());
    for (auto& e : events) ASSERT_EQ(api.event_create(&e), cudaSuccess);

    for (int step = 1; step <= 2; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(step * (me + 1) + i);
      api.clear_journal();
      api.hold(compute, true);  // backward's kernels are still running
      cudaEvent_t probe = nullptr;
      ASSERT_EQ(api.event_create(&probe), cudaSuccess);
      for (std::size_t i = 0; i < backward.size(); ++i) {
        ASSERT_EQ(api.event_record(events[i], compute), cudaSuccess);
        bucketer.mark_ready(backward[i], events[i]);
        const auto j = api.journal();
        // The comm stream waited on this range's event at once; a bucket's allreduce is enqueued as soon as
        // its last range arrived, never before.
        ASSERT_FALSE(j.empty());
        const bool completes_bucket = i == 0 || i == backward.size() - 1;
        const auto& last = j.back();
        if (completes_bucket) {
          ASSERT_GE(j.size(), 2u);
          EXPECT_EQ(last.op, "allreduce");
          EXPECT_EQ(last.stream, nccl.stream());
          EXPECT_EQ(last.data, grads.data() + (i == 0 ? 20 : 0));
          EXPECT_EQ(last.count, 20u);
          EXPECT_EQ(j[j.size() - 2].op, "wait");
          EXPECT_EQ(j[j.size() - 2].event, events[i]);
        } else {
          EXPECT_EQ(last.op, "wait");
          EXPECT_EQ(last.stream, nccl.stream());
          EXPECT_EQ(last.event, events[i]);
        }
      }
      // Both reductions are enqueued, but the communication stream waits for backward: nothing has run.
      ASSERT_EQ(api.event_record(probe, nccl.stream()), cudaSuccess);
      for (int k = 0; k < 20; ++k) EXPECT_EQ(api.event_query(probe), cudaErrorNotReady);
      EXPECT_EQ(grads[0], static_cast<float>(step * (me + 1)));
      const auto j = api.journal();
      std::vector<std::string> ops;
      for (const auto& e : j) ops.push_back(e.op);
      EXPECT_EQ(ops, (std::vector<std::string>{"wait", "allreduce", "wait", "wait", "wait", "allreduce"}));

      api.hold(compute, false);  // backward done
      bucketer.finish();
      EXPECT_EQ(api.event_query(probe), cudaSuccess);
      api.event_destroy(probe);
      const float ranks = static_cast<float>(n * (n + 1) / 2);
      for (std::size_t i = 0; i < grads.size(); ++i) {
        ASSERT_FLOAT_EQ(grads[i], static_cast<float>(step) * ranks + static_cast<float>(n * i)) << i;
      }
      EXPECT_GE(bucketer.last_comm_ms(), 0.0);
      EXPECT_GE(bucketer.last_exposed_ms(), 0.0);
    }
    // A step whose ranges were not all reported is a bug of the caller, and re-arms the bucketer.
    bucketer.mark_ready(backward[0], nullptr);
    EXPECT_THROW(bucketer.finish(), InternalError);
    for (auto& e : events) api.event_destroy(e);
    api.stream_destroy(compute);
  }
  view.barrier_sync();
  // The incomplete step above left one allreduce enqueued on every rank: the destructor's finalize
  // completed it, since every rank had enqueued it.
  expect_clean(api);
}

// ---- a rank killed inside an NCCL collective (ULFM) -------------------------------------------------------

#if SINEW_HAVE_ULFM
/// The recovery of the train layer, reduced to its steps: the failure is seen on `nccl`; abort NCCL first,
/// then the MPI view (revoke: members blocked in it return), shrink the group, rebuild both over the new
/// view, and check that an allreduce works.
void recover_and_check(Group& group, std::unique_ptr<MpiBackend>& view, std::unique_ptr<NcclBackend>& nccl,
                       FakeApi& api, int n_before) {
  nccl->abort();
  view->abort();
  const auto rep = group.shrink();
  g_live = std::make_unique<mpi::Communicator>(group.comm().dup());
  EXPECT_EQ(rep.lost, 1);
  EXPECT_EQ(group.size(), n_before - 1);
  nccl.reset();  // after the abort: no call on the old communicator (checked below)
  view = std::make_unique<MpiBackend>(group.comm());
  nccl = std::make_unique<NcclBackend>(*view, api, comm::Options{std::chrono::seconds(20)});
  EXPECT_EQ(nccl->size(), n_before - 1);
  std::vector<float> x(100, 1.0F);
  nccl->allreduce_sync(Buffer::of(std::span(x)), ReduceOp::kSum, comm::Options{std::chrono::seconds(20)});
  EXPECT_EQ(x, std::vector<float>(100, static_cast<float>(n_before - 1)));
  EXPECT_EQ(api.live_comms(), 1);  // only the rebuilt one
  EXPECT_EQ(api.comms_aborted(), 1);
  EXPECT_TRUE(api.misuse().empty()) << api.misuse().front();
  nccl.reset();
  view->barrier_sync();
  expect_clean(api);
}

constexpr int kVictim = 1;  // a middle rank
constexpr auto kOpTimeout = std::chrono::seconds(300);
constexpr auto kMustDetectWithin = std::chrono::seconds(2);

void kill_self_soon() {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the survivors are inside the collective
  std::raise(SIGKILL);
}
#endif

TEST(NcclFakeFailure, KilledPeerIsARemoteError) {
#if SINEW_HAVE_ULFM
  if (!mpi::ulfm_enabled()) GTEST_SKIP() << kNeedsUlfm;
  const Deadline deadline(std::chrono::seconds(50), test_name());
  auto group = Group::over(live());
  const int n = group.size();
  ASSERT_GE(n, 3);
  FakeApi::Config config;
  config.dead_peer = FakeApi::DeadPeer::kRemoteError;
  config.remote_error_after = std::chrono::milliseconds(0);
  FakeApi api(config);
  auto view = std::make_unique<MpiBackend>(group.comm());
  auto nccl = std::make_unique<NcclBackend>(*view, api);
  std::vector<float> x(64, 1.0F);
  nccl->allreduce_sync(Buffer::of(std::span(x)), ReduceOp::kSum);  // healthy first
  if (group.rank() == kVictim) kill_self_soon();

  const auto start = Clock::now();
  try {
    nccl->allreduce(Buffer::of(std::span(x)), ReduceOp::kSum, {kOpTimeout})->wait(kOpTimeout);
    ADD_FAILURE() << "the allreduce completed without the killed rank";
  } catch (const Timeout& e) {
    ADD_FAILURE() << "a dead peer was noticed only at the deadline: " << e.what();
  } catch (const CommFailure& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::printf("[rank %d] CommFailure after %lld ms (victim slept 200 ms): %s\n", group.rank(),
                static_cast<long long>(ms), e.message().c_str());
    const std::string what = e.message();
    // NCCL's remote error, or the MPI view if it was first: either way within milliseconds.
    EXPECT_TRUE(what.find("remote process exited") != std::string::npos ||
                what.find("died") != std::string::npos)
        << what;
  }
  EXPECT_LT(Clock::now() - start, kMustDetectWithin);
  EXPECT_TRUE(nccl->aborted());
  recover_and_check(group, view, nccl, api, n);
#else
  GTEST_SKIP() << kNeedsUlfm;
#endif
}

TEST(NcclFakeFailure, KilledPeerThatNcclNeverReportsEndsByTheMpiView) {
#if SINEW_HAVE_ULFM
  if (!mpi::ulfm_enabled()) GTEST_SKIP() << kNeedsUlfm;
  const Deadline deadline(std::chrono::seconds(50), test_name());
  auto group = Group::over(live());
  const int n = group.size();
  ASSERT_GE(n, 3);
  FakeApi::Config config;
  config.dead_peer = FakeApi::DeadPeer::kNeverComplete;
  FakeApi api(config);
  auto view = std::make_unique<MpiBackend>(group.comm());
  auto nccl = std::make_unique<NcclBackend>(*view, api);
  // Through the bucketer this time: finish() is the wait that must end.
  std::vector<float> grads(48, 1.0F);
  DeviceBucketOptions o;
  o.bucket_bytes = 16 * sizeof(float);
  o.op.timeout = kOpTimeout;
  DeviceBucketer bucketer(*nccl, grads.data(), grads.size(), {{32, 16}, {16, 16}, {0, 16}}, o);
  for (const auto& r : {Slice{32, 16}, Slice{16, 16}, Slice{0, 16}}) bucketer.mark_ready(r, nullptr);
  bucketer.finish();
  EXPECT_EQ(grads, std::vector<float>(48, static_cast<float>(n)));
  if (group.rank() == kVictim) kill_self_soon();

  const auto start = Clock::now();
  try {
    for (const auto& r : {Slice{32, 16}, Slice{16, 16}, Slice{0, 16}}) bucketer.mark_ready(r, nullptr);
    bucketer.finish();
    ADD_FAILURE() << "the buckets completed without the killed rank";
  } catch (const Timeout& e) {
    ADD_FAILURE() << "a dead peer was noticed only at the deadline: " << e.what();
  } catch (const CommFailure& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    std::printf("[rank %d] CommFailure after %lld ms (victim slept 200 ms): %s\n", group.rank(),
                static_cast<long long>(ms), e.message().c_str());
    // The MPI view's failure state: the dead rank itself, or the revocation by a survivor that saw it first.
    EXPECT_TRUE(e.message().find("rank(s) 1 of the MPI view died") != std::string::npos ||
                e.message().find("revoked the MPI view") != std::string::npos)
        << e.message();
  }
  EXPECT_LT(Clock::now() - start, kMustDetectWithin);
  EXPECT_TRUE(nccl->aborted());
  recover_and_check(group, view, nccl, api, n);
#else
  GTEST_SKIP() << kNeedsUlfm;
#endif
}

TEST(NcclFakeFailure, KilledPeerInAReduceScatterOfShards) {
#if SINEW_HAVE_ULFM
  if (!mpi::ulfm_enabled()) GTEST_SKIP() << kNeedsUlfm;
  const Deadline deadline(std::chrono::seconds(50), test_name());
  auto group = Group::over(live());
  const int n = group.size();
  ASSERT_GE(n, 3);
  FakeApi api;  // NCCL reports the remote error
  auto view = std::make_unique<MpiBackend>(group.comm());
  auto nccl = std::make_unique<NcclBackend>(*view, api);
  // Uneven blocks (a group of ncclReduce, one per shard): the survivors' group must end, not wait.
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (std::size_t k = 0; k < counts.size(); ++k) counts[k] = k + 1;
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  std::vector<float> in(total, 1.0F), out(counts[static_cast<std::size_t>(group.rank())]);
  nccl->reduce_scatter(Buffer::of(std::span(in)), Buffer::of(std::span(out)), counts, ReduceOp::kSum, {})
      ->wait(kOpTimeout);  // healthy first
  EXPECT_EQ(out, std::vector<float>(out.size(), static_cast<float>(n)));
  if (group.rank() == kVictim) kill_self_soon();

  const auto start = Clock::now();
  try {
    nccl->reduce_scatter(Buffer::of(std::span(in)), Buffer::of(std::span(out)), counts, ReduceOp::kSum,
                         {kOpTimeout})
        ->wait(kOpTimeout);
    ADD_FAILURE() << "the reduce-scatter completed without the killed rank";
  } catch (const Timeout& e) {
    ADD_FAILURE() << "a dead peer was noticed only at the deadline: " << e.what();
  } catch (const CommFailure& e) {
    std::printf("[rank %d] CommFailure: %s\n", group.rank(), e.message().c_str());
    EXPECT_NE(e.message().find("reduce_scatter"), std::string::npos) << e.message();
  }
  EXPECT_LT(Clock::now() - start, kMustDetectWithin);
  EXPECT_TRUE(nccl->aborted());
  recover_and_check(group, view, nccl, api, n);
#else
  GTEST_SKIP() << kNeedsUlfm;
#endif
}

// ---- growth --------------------------------------------------------------------------------------------

/// Collective over the grown view, alike at the parents and the spawned member: an NCCL backend over the
/// view's MPI backend, an allreduce and an allgather. Returns the allgather of the ranks (empty on error).
std::vector<std::int32_t> nccl_over_grown_view(const Group& group, FakeApi& api) {
  MpiBackend view(group.comm());
  std::vector<std::int32_t> ranks(static_cast<std::size_t>(view.size()), -1);
  {
    NcclBackend nccl(view, api, comm::Options{std::chrono::seconds(20)});
    std::vector<float> x(10, 1.0F);
    nccl.allreduce_sync(Buffer::of(std::span(x)), ReduceOp::kSum);
    if (x != std::vector<float>(10, static_cast<float>(view.size()))) return {};
    std::int32_t me = view.rank();
    nccl.allgather_sync(Buffer{&me, 1, DType::kInt32}, Buffer::of(std::span(ranks)));
  }
  view.barrier_sync();
  return ranks;
}

TEST(NcclFake, RebuildAfterGrowth) {
  const Deadline deadline(std::chrono::seconds(50), test_name());
  SpawnCommand cmd = g_self;
  cmd.args.emplace_back(kSpawnedMemberFlag);
  auto group = Group::over(live(), cmd);
  const int n = group.size();
  FakeApi api;
  {
    MpiBackend view(group.comm());
    NcclBackend nccl(view, api);
    nccl.barrier_sync();
  }  // the old view's backends go before the group changes, as the train layer rebuilds them
  try {
    group.grow(1);
  } catch (const Error& e) {
    FAIL() << "grow(1) failed: " << e.what();
  }
  ASSERT_EQ(group.size(), n + 1);
  const auto ranks = nccl_over_grown_view(group, api);
  std::vector<std::int32_t> expect(static_cast<std::size_t>(n + 1));
  std::iota(expect.begin(), expect.end(), 0);
  EXPECT_EQ(ranks, expect);
  expect_clean(api);
  EXPECT_EQ(api.comms_created(), 2);
  group.split_leave(false);  // the spawned member leaves again
  EXPECT_EQ(group.size(), n);
}

int spawned_member_main(const SpawnCommand& self) {
  const Deadline deadline(std::chrono::seconds(50), "spawned member");
  try {
    auto group = Group::attach(self);
    FakeApi api;
    const auto ranks = nccl_over_grown_view(group, api);
    const bool ok =
        static_cast<int>(ranks.size()) == group.size() && api.live_comms() == 0 && api.misuse().empty();
    group.split_leave(true);
    if (!ok) std::fprintf(stderr, "[nccl_backend_test] spawned member: the NCCL checks failed\n");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[nccl_backend_test] spawned member: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto self = SpawnCommand::of_this_process(argc, argv);
  const bool spawned =
      std::find(self.args.begin(), self.args.end(), std::string(kSpawnedMemberFlag)) != self.args.end();
  testing::InitGoogleTest(&argc, argv);
  mpi::Environment env(&argc, &argv);
  log::init(env.world_rank(), env.world_size(), spdlog::level::warn);
  if (spawned) return spawned_member_main(self);

  g_self = self;
  g_live = std::make_unique<mpi::Communicator>(mpi::Communicator::borrow(MPI_COMM_WORLD).dup());
  test::print_failures_only(env.world_rank());
  auto outcome = test::local_outcome(RUN_ALL_TESTS());
  const int rc = MPI_Allreduce(MPI_IN_PLACE, outcome.data(), 3, MPI_INT, MPI_MAX, live().get());
  const bool first = live().rank() == 0;
  g_live.reset();
  const char* why = "";
  int code = test::exit_code(outcome, why);
  if (rc != MPI_SUCCESS) code = 1;
  if (first || rc != MPI_SUCCESS) {
    std::printf("[nccl_backend_test] verdict: %s\n", rc != MPI_SUCCESS ? "failed: no agreement" : why);
    std::fflush(stdout);
  }
  return code;
}
