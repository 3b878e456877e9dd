// The membership layer on 3-4 ranks: a group over a communicator, growth by spawn + merge (the spawned
// member is this test program itself), a planned leave, a spawn that cannot work, and, with ULFM, the
// recovery protocol after ranks are killed through the fault points (core/fault.hpp).
//
// This program has its own main() (below), for two reasons:
//   - a process started by Group::grow() runs it with --spawned-member: it joins its parents' group
//     (Group::attach), takes part in their collectives and leaves again, instead of running the tests;
//   - tests that kill ranks leave MPI_COMM_WORLD with dead members, so the final verdict is reduced over
//     the survivors (live()), not over MPI_COMM_WORLD, where a collective could block forever.
// The killing tests run one per mpirun job (ALONE in tests/mpi/CMakeLists.txt): each starts from a whole
// job, and a failure in one cannot cascade into another. Under ULFM mpirun exits 0 when every process
// that was not killed exits 0 (the elastic scenarios of tests/cli rely on the same), so the job's exit
// status is the survivors' verdict. A failed spawn, though, makes mpirun exit non-zero even when every
// process passed: the test that spawns a missing program runs alone and ctest reads main()'s verdict line.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_main.hpp"
#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/log.hpp"
#include "sinew/core/names.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/check.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/mpi/environment.hpp"
#if SINEW_HAVE_ULFM
#include <mpi-ext.h>
#endif

using namespace sinew;
using membership::Group;
using membership::Role;
using membership::SpawnCommand;

namespace {

/// The argument that makes this program act as a member spawned by a test's grow().
constexpr const char* kSpawnedMemberFlag = "--spawned-member";
constexpr const char* kNeedsUlfm = "needs ULFM (Open MPI 5 and mpirun --with-ft ulfm)";

/// This program's own command (recorded in main() before gtest and MPI take their flags out of argv).
SpawnCommand g_self;
/// The members of this job still alive: a duplicate of MPI_COMM_WORLD at start, replaced by a test that
/// loses members. Tests build their groups over it; main() reduces the verdict over it.
std::unique_ptr<mpi::Communicator> g_live;

const mpi::Communicator& live() { return *g_live; }

/// After a test lost members: its group's view holds the survivors from now on.
void adopt_as_live(const Group& group) { g_live = std::make_unique<mpi::Communicator>(group.comm().dup()); }

/// The command that starts this program as a spawned member.
SpawnCommand spawned_member_command() {
  SpawnCommand cmd = g_self;
  cmd.args.emplace_back(kSpawnedMemberFlag);
  return cmd;
}

/// Ends this process if the scope is not left within `limit`: a hang fails the test at once, with a line
/// that names it, instead of blocking ctest until its own timeout.
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
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr,
                 "[membership_test] DEADLINE: %s did not finish within %lld s on world rank %d; exiting\n",
                 what_.c_str(), static_cast<long long>(limit.count()), rank);
    std::fflush(stderr);
    // Not MPI_Abort: under ULFM (Open MPI 5.0.7, --with-ft ulfm) it left the job hanging until ctest's
    // timeout. Every rank runs the same test under the same deadline, so each one ends itself; a process
    // that exits without MPI_Finalize makes mpirun exit non-zero.
    std::_Exit(124);
  }

  std::string what_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

std::chrono::seconds test_deadline() { return std::chrono::seconds(60); }

std::string current_test_name() {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return info != nullptr ? std::string(info->test_suite_name()) + "." + info->name() : "spawned member";
}

std::string serialize(const SpawnCommand& cmd) {
  std::string out = cmd.program;
  for (const auto& a : cmd.args) {
    out.push_back('\0');
    out += a;
  }
  return out;
}

/// What one member says about itself; gathered at every member by exchange_views().
struct MemberView {
  int rank = -1;
  int size = 0;
  int epoch = -1;
  int role = -1;
  int launch_rank = -2;
  int same_command = 0;  ///< rank 0's spawn command equals this member's `mine`
};
constexpr int kViewInts = 6;
static_assert(sizeof(MemberView) == kViewInts * sizeof(int));

/// Collective over the group, run alike by the test's ranks and by the spawned member: rank 0 broadcasts
/// the group's spawn command, every member compares it with `mine` (for a spawned member: the command
/// its own main() recorded), then all views are gathered. Empty if an MPI call failed.
std::optional<std::vector<MemberView>> exchange_views(const Group& group, const SpawnCommand& mine) {
  MPI_Comm comm = group.comm().get();
  std::string wire = group.rank() == 0 ? serialize(group.spawn_command()) : std::string();
  int length = static_cast<int>(wire.size());
  if (MPI_Bcast(&length, 1, MPI_INT, 0, comm) != MPI_SUCCESS) return std::nullopt;
  wire.resize(static_cast<std::size_t>(length));
  if (MPI_Bcast(wire.data(), length, MPI_CHAR, 0, comm) != MPI_SUCCESS) return std::nullopt;
  const MemberView me{group.rank(),
                      group.size(),
                      static_cast<int>(group.epoch()),
                      static_cast<int>(group.role()),
                      group.launch_rank(),
                      wire == serialize(mine) ? 1 : 0};
  std::vector<MemberView> all(static_cast<std::size_t>(group.size()));
  if (MPI_Allgather(&me, kViewInts, MPI_INT, all.data(), kViewInts, MPI_INT, comm) != MPI_SUCCESS) {
    return std::nullopt;
  }
  return all;
}

/// The values of `mine` from every member of `comm`, in rank order (EXPECTs success).
std::vector<int> allgather(MPI_Comm comm, int mine) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  std::vector<int> all(static_cast<std::size_t>(size), -1);
  EXPECT_EQ(MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, comm), MPI_SUCCESS);
  return all;
}

/// 0, 1, ..., n-1 without the ranks in `gone`.
std::vector<int> ranks_without(int n, const std::vector<int>& gone) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r)
    if (std::find(gone.begin(), gone.end(), r) == gone.end()) out.push_back(r);
  return out;
}

/// An allreduce on a fresh duplicate of the view, as a rebuilt backend would do it.
void expect_collective_works(const Group& group) {
  const auto backend = group.comm().dup();
  int x = 1;
  ASSERT_EQ(MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, backend.get()), MPI_SUCCESS);
  EXPECT_EQ(x, group.size());
}

#if SINEW_HAVE_ULFM
/// Training steps reduced to their collective: allreduces on a duplicate of the view (what a backend
/// holds), with the fault point "allreduce" before each, until one fails. Then what the train layer does
/// first: abort the backend, which revokes its communicator, so that members still blocked in it return
/// and reach the shrink. Returns the step at which this rank saw the failure (-1: none).
int allreduce_until_failure(const Group& group, const fault::Plan& plan) {
  const auto backend = group.comm().dup();
  for (int step = 1; step <= 100000; ++step) {
    plan.at(fault::Point::kAllreduce, step);
    int x = 1;
    if (MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_INT, MPI_SUM, backend.get()) != MPI_SUCCESS) {
      MPIX_Comm_revoke(backend.get());
      return step;
    }
  }
  return -1;
}
#endif

// ---- a group and its names ----------------------------------------------------------------------------

TEST(Membership, RoleNamesComeFromOneTable) {
  static_assert(membership::role_name(Role::kSurvivor) == "survivor");
  EXPECT_EQ(membership::role_name(Role::kInitial), "initial");
  EXPECT_EQ(membership::role_name(Role::kRecovered), "recovered");
  EXPECT_EQ(parse_name(membership::kRoleNames, "recovered", "role"), Role::kRecovered);
  EXPECT_EQ(names_list(membership::kRoleNames), "initial, survivor, recovered");
}

TEST(Membership, SpawnCommandIsThisProgramWithItsArguments) {
  const char* argv[] = {"relative/name", "--a", "b"};
  const auto cmd = SpawnCommand::of_this_process(3, argv);
  EXPECT_EQ(cmd.program, std::filesystem::canonical("/proc/self/exe").string());
  EXPECT_EQ(cmd.args, (std::vector<std::string>{"--a", "b"}));
  EXPECT_FALSE(cmd.empty());
  EXPECT_TRUE(SpawnCommand::of_this_process(1, argv).args.empty());
  EXPECT_TRUE(SpawnCommand{}.empty());
  // main() recorded this very program.
  EXPECT_EQ(g_self.program, cmd.program);
}

TEST(Membership, OverACommunicatorIsADuplicateAtEpochZero) {
  const Deadline deadline(test_deadline(), current_test_name());
  const auto group = Group::over(live(), SpawnCommand{"some-program", {"x"}});
  EXPECT_EQ(group.rank(), live().rank());
  EXPECT_EQ(group.size(), live().size());
  EXPECT_EQ(group.epoch(), 0u);
  EXPECT_EQ(group.role(), Role::kInitial);
  EXPECT_EQ(group.launch_rank(), live().rank());
  EXPECT_EQ(group.spawn_command(), (SpawnCommand{"some-program", {"x"}}));
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(group.comm().get(), live().get(), &cmp);
  EXPECT_EQ(cmp, MPI_CONGRUENT);  // same members, own message space
  expect_collective_works(group);
}

// ---- growth -----------------------------------------------------------------------------------------

TEST(Membership, GrowWithoutASpawnCommandThrowsSpawnError) {
  const Deadline deadline(test_deadline(), current_test_name());
  auto group = Group::over(live());
  EXPECT_TRUE(group.spawn_command().empty());
  EXPECT_EQ(group.grow(0).added, 0);  // nothing to start: no error
  try {
    group.grow(1);
    ADD_FAILURE() << "grow(1) without a spawn command did not throw";
  } catch (const membership::SpawnError& e) {
    EXPECT_NE(e.message().find("no spawn command"), std::string::npos) << e.message();
  }
  EXPECT_EQ(group.size(), live().size());
  EXPECT_EQ(group.epoch(), 0u);
  expect_collective_works(group);
}

TEST(Membership, GrowWithAMissingProgramThrowsAndKeepsTheView) {
  const Deadline deadline(test_deadline(), current_test_name());
  auto group = Group::over(live(), SpawnCommand{"/nonexistent/sinew-no-such-program", {"--x"}});
  const int n = group.size(), me = group.rank();
  try {
    group.grow(1);
    ADD_FAILURE() << "spawning a program that does not exist did not throw";
  } catch (const membership::SpawnError& e) {
    EXPECT_FALSE(e.message().empty());
  }
  EXPECT_EQ(group.size(), n);
  EXPECT_EQ(group.rank(), me);
  EXPECT_EQ(group.epoch(), 0u);
  EXPECT_EQ(group.role(), Role::kInitial);
  expect_collective_works(group);
}

TEST(Membership, GrowMergesASpawnedMemberLast) {
  const Deadline deadline(test_deadline(), current_test_name());
  auto group = Group::over(live(), spawned_member_command());
  const int n = group.size(), me = group.rank();
  membership::GrowReport rep;
  try {
    rep = group.grow(1);  // the new process runs spawned_member_main() below
  } catch (const Error& e) {
    FAIL() << "grow(1) failed: " << e.what();  // alike at every rank: none is left in a collective
  }
  EXPECT_EQ(rep.added, 1);
  EXPECT_EQ(group.size(), n + 1);
  EXPECT_EQ(group.rank(), me);
  EXPECT_EQ(group.epoch(), 1u);
  EXPECT_EQ(group.role(), Role::kSurvivor);

  // One collective with the new member, which reports how it sees the group.
  const auto views = exchange_views(group, group.spawn_command());
  ASSERT_TRUE(views.has_value());
  ASSERT_EQ(views->size(), static_cast<std::size_t>(n + 1));
  for (int r = 0; r <= n; ++r) {
    const auto& v = (*views)[static_cast<std::size_t>(r)];
    SCOPED_TRACE("member " + std::to_string(r));
    EXPECT_EQ(v.rank, r);
    EXPECT_EQ(v.size, n + 1);
    EXPECT_EQ(v.epoch, 1);
    // The spawned member comes last, recovered, with no launch rank, and its own main() recorded the
    // command it was started with: it can grow the group in turn.
    EXPECT_EQ(v.role, static_cast<int>(r < n ? Role::kSurvivor : Role::kRecovered));
    EXPECT_EQ(v.launch_rank, r < n ? r : -1);
    EXPECT_EQ(v.same_command, 1);
  }

  // The spawned member leaves again (it exits); the others go on as before, one epoch later.
  group.split_leave(false);
  EXPECT_EQ(group.size(), n);
  EXPECT_EQ(group.rank(), me);
  EXPECT_EQ(group.epoch(), 2u);
  expect_collective_works(group);
}

// ---- leave ------------------------------------------------------------------------------------------

TEST(Membership, SplitLeaveKeepsTheOthersInOrder) {
  const Deadline deadline(test_deadline(), current_test_name());
  auto group = Group::over(live());  // a duplicate: the leaving process stays in live() for later tests
  const int n = group.size(), me = group.rank();
  constexpr int kLeaver = 1;  // a middle rank: the ranks after it move down
  group.split_leave(me == kLeaver);
  EXPECT_EQ(group.epoch(), 1u);
  if (me == kLeaver) {
    EXPECT_EQ(group.rank(), -1);
    EXPECT_EQ(group.size(), 0);
    EXPECT_FALSE(group.comm().valid());
    return;
  }
  EXPECT_EQ(group.size(), n - 1);
  EXPECT_EQ(group.rank(), me < kLeaver ? me : me - 1);
  EXPECT_EQ(group.role(), Role::kSurvivor);
  EXPECT_EQ(allgather(group.comm().get(), me), ranks_without(n, {kLeaver}));
  expect_collective_works(group);
}

// ---- failures (ULFM), one per mpirun job --------------------------------------------------------------

TEST(MembershipFailure, ShrinkAfterAKilledRank) {
#if SINEW_HAVE_ULFM
  if (!mpi::ulfm_enabled()) GTEST_SKIP() << kNeedsUlfm;
  const Deadline deadline(test_deadline(), current_test_name());
  auto group = Group::over(live());
  const int n = group.size(), me = group.rank();
  ASSERT_GE(n, 3);
  constexpr int kVictim = 1;  // a middle rank: the ranks after it move down
  const fault::Plan plan({{kVictim, fault::Point::kAllreduce, 3}}, me, 0);
  EXPECT_GE(allreduce_until_failure(group, plan), 3);

  const auto rep = group.shrink();
  adopt_as_live(group);
  EXPECT_EQ(rep.lost, 1);
  EXPECT_GE(rep.attempts, 1);
  EXPECT_EQ(group.size(), n - 1);
  EXPECT_EQ(group.epoch(), static_cast<std::uint64_t>(rep.attempts));  // one per attempt, from 0
  EXPECT_EQ(group.rank(), me < kVictim ? me : me - 1);
  EXPECT_EQ(group.role(), Role::kSurvivor);
  EXPECT_EQ(group.launch_rank(), me);
  // The new view's ranks are the survivors' old ranks, in order.
  EXPECT_EQ(allgather(group.comm().get(), me), ranks_without(n, {kVictim}));
  expect_collective_works(group);
#else
  GTEST_SKIP() << kNeedsUlfm;
#endif
}

TEST(MembershipFailure, ShrinkRetriesWhenAMemberDiesDuringRecovery) {
#if SINEW_HAVE_ULFM
  if (!mpi::ulfm_enabled()) GTEST_SKIP() << kNeedsUlfm;
  const Deadline deadline(test_deadline(), current_test_name());
  auto group = Group::over(live());
  const int n = group.size(), me = group.rank();
  ASSERT_GE(n, 3);
  // Rank 1 dies in a collective; the last rank sees that failure, starts the recovery and dies at the
  // start of its first attempt (the recovery hook), before it revoked anything.
  const int first = 1, second = n - 1;
  const fault::Plan plan({{first, fault::Point::kAllreduce, 3}, {second, fault::Point::kRecovery, 1}}, me, 0);
  EXPECT_GE(allreduce_until_failure(group, plan), 3);

  int hook_calls = 0;
  const auto rep = group.shrink([&](int attempt) {
    EXPECT_EQ(attempt, ++hook_calls);
    plan.at(fault::Point::kRecovery, attempt);
  });
  adopt_as_live(group);
  // Either one shrink already left both out, or the second death broke the agreement and the protocol
  // started again: the outcome is the same.
  std::printf("[rank %d] shrink: %d attempt(s), %d lost\n", me, rep.attempts, rep.lost);
  EXPECT_TRUE(rep.attempts >= 2 || rep.lost == 2);
  EXPECT_EQ(rep.lost, 2);
  EXPECT_EQ(hook_calls, rep.attempts);
  EXPECT_EQ(group.size(), n - 2);
  EXPECT_EQ(group.epoch(), static_cast<std::uint64_t>(rep.attempts));
  EXPECT_EQ(group.rank(), me < first ? me : me - 1);
  EXPECT_EQ(group.role(), Role::kSurvivor);
  EXPECT_EQ(allgather(group.comm().get(), me), ranks_without(n, {first, second}));
  // The survivors agree on the outcome.
  for (const int value : {group.size(), static_cast<int>(group.epoch()), rep.attempts, rep.lost}) {
    const auto all = allgather(group.comm().get(), value);
    EXPECT_TRUE(std::all_of(all.begin(), all.end(), [&](int v) { return v == value; }));
  }
  expect_collective_works(group);
#else
  GTEST_SKIP() << kNeedsUlfm;
#endif
}

// ---- the spawned member --------------------------------------------------------------------------------

/// A process started by GrowMergesASpawnedMemberLast: joins the group (collective with the parents'
/// grow()), answers exchange_views() with the command its own main() recorded, leaves. Its checks run
/// at the parents, which see its view; it fails only if MPI does.
int spawned_member_main(const SpawnCommand& self) {
  const Deadline deadline(test_deadline(), "spawned member");
  try {
    auto group = Group::attach(self);
    if (!exchange_views(group, self)) {
      std::fprintf(stderr, "[membership_test] spawned member: exchanging views failed\n");
      return 1;
    }
    group.split_leave(true);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[membership_test] spawned member: %s\n", e.what());
    return 1;
  }
}

}  // namespace

/// The exit codes of tests/mpi/mpi_main.cpp (1 failed, 77 skipped, 0 passed), reduced over the survivors.
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
  // Reduced over the members still alive, not MPI_COMM_WORLD.
  const int rc = MPI_Allreduce(MPI_IN_PLACE, outcome.data(), 3, MPI_INT, MPI_MAX, live().get());
  const bool first = live().rank() == 0;
  g_live.reset();
  // One verdict line from the first survivor: the ctest tests whose mpirun exits non-zero although every
  // process passed (a failed spawn) read it instead of the exit status (tests/mpi/CMakeLists.txt).
  const char* why = "";
  int code = test::exit_code(outcome, why);
  std::string text = why;
  if (rc != MPI_SUCCESS) {
    code = 1;
    text = "failed: the survivors could not agree on the result (" + mpi::error_string(rc) + ")";
  }
  if (first || rc != MPI_SUCCESS) {
    std::printf("[membership_test] verdict: %s\n", text.c_str());
    std::fflush(stdout);
  }
  return code;
}
