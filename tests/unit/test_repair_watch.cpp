// The repair deadlines (membership/repair_watch.hpp): a call past its deadline is acted on by the watch's
// own thread while the calling thread stays blocked; a call that returns in time is not.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sinew/membership/repair_watch.hpp"

namespace {

using sinew::membership::repair_deadline;
using sinew::membership::RepairWatch;
using std::chrono::milliseconds;

/// Records the expired calls (instead of ending the process) while it lives.
class Recorder {
 public:
  Recorder() {
    RepairWatch::process().on_expired([this](const std::string& what, milliseconds d) {
      std::lock_guard lock(mu_);
      expired_.push_back(what + " " + std::to_string(d.count()));
      cv_.notify_all();
    });
  }
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;
  ~Recorder() { RepairWatch::process().on_expired({}); }
  /// Waits up to `within` for `n` expired calls; returns what has expired by then.
  std::vector<std::string> wait_for(std::size_t n, milliseconds within) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, within, [&] { return expired_.size() >= n; });
    return expired_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> expired_;
};

}  // namespace

TEST(RepairDeadline, GrowsWithTheDetectionTimeAndTheGroup) {
  EXPECT_EQ(repair_deadline(4, milliseconds(10000)), milliseconds(15040));
  EXPECT_EQ(repair_deadline(1024, milliseconds(10000)), milliseconds(25240));
  EXPECT_EQ(repair_deadline(4, milliseconds(3000)), milliseconds(8040));
  EXPECT_EQ(repair_deadline(0, milliseconds(0)), milliseconds(5010));  // at least one process
}

TEST(RepairWatch, ACallPastItsDeadlineIsActedOnWhileItIsStillBlocked) {
  Recorder rec;
  std::mutex stuck;
  std::unique_lock hold(stuck);  // the "MPI call" below blocks on it until the end of the test
  std::thread caller([&] {
    const auto guard = RepairWatch::process().arm("shrink (attempt 1)", milliseconds(50));
    const std::lock_guard blocked(stuck);
  });
  const auto expired = rec.wait_for(1, milliseconds(10000));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], "shrink (attempt 1) 50");
  hold.unlock();
  caller.join();
}

TEST(RepairWatch, ACallThatReturnsInTimeIsNotActedOn) {
  Recorder rec;
  {
    auto guard = RepairWatch::process().arm("agreement", milliseconds(5000));
    auto moved = std::move(guard);  // a moved-from guard disarms nothing twice
  }
  auto released = RepairWatch::process().arm("merge", milliseconds(5000));
  released.release();
  // A later, nested deadline still fires on time: the earlier ones did not leave the thread waiting.
  const auto outer = RepairWatch::process().arm("outer", milliseconds(60000));
  const auto inner = RepairWatch::process().arm("inner", milliseconds(300));
  const auto expired = rec.wait_for(2, milliseconds(1500));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], "inner 300");
}

TEST(RepairWatchDeathTest, TheDefaultLeavesWithExitCode75AndSaysWhatWasStuck) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const auto guard = RepairWatch::process().arm("revoke and shrink (attempt 2)", milliseconds(100));
        std::this_thread::sleep_for(std::chrono::seconds(30));
      },
      testing::ExitedWithCode(75),
      "revoke and shrink \\(attempt 2\\) did not return within 0.1 s: stuck inside the MPI library.*exiting "
      "for a relaunch from the latest checkpoint \\(exit code 75\\)");
}

// A process whose launcher daemon dies leaves (exit 75) instead of training on unseen: here the "daemon" is
// a child that forks the "rank" and exits; the rank is reparented to this process (a subreaper, as init
// would take it), notices within 0.2 s, says so and exits 75, which this process passes on.
TEST(RepairWatchDeathTest, AProcessWhoseLauncherDiesLeavesWithExitCode75) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ::prctl(PR_SET_CHILD_SUBREAPER, 1);
        int ready[2];
        if (::pipe(ready) != 0) std::_Exit(2);
        const pid_t daemon = ::fork();
        if (daemon == 0) {
          if (::fork() == 0) {  // the rank
            RepairWatch::leave_when_orphaned();
            char c = 1;
            (void)!::write(ready[1], &c, 1);
            std::this_thread::sleep_for(std::chrono::seconds(10));
            std::_Exit(0);  // not reached: it leaves when its parent is gone
          }
          char c = 0;
          (void)!::read(ready[0], &c, 1);
          std::_Exit(0);  // the daemon dies
        }
        ::waitpid(daemon, nullptr, 0);
        const auto t0 = std::chrono::steady_clock::now();
        int status = 0;
        while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
          if (::waitpid(-1, &status, WNOHANG) > 0) std::_Exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        std::_Exit(4);  // the rank did not leave within 5 s
      },
      testing::ExitedWithCode(75),
      "the launcher's process on this node \\(pid [0-9]+\\) is gone: leaving without MPI_Finalize, exiting "
      "for a "
      "relaunch from the latest checkpoint \\(exit code 75\\)");
}
