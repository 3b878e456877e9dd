// The job's status records for its launcher (core/status.hpp): one JSON object per line in a file of the
// process's own, written whole, also from a thread that _Exits right after; nothing without a directory.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "sinew/core/launch.hpp"
#include "sinew/core/status.hpp"

namespace {

namespace fs = std::filesystem;
using sinew::status::Identity;
using sinew::status::Reason;
using sinew::status::Writer;

/// A fresh directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "sinew-status-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { fs::remove_all(path_); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Identity who(int rank = 2) { return Identity{"node7", 4242, rank, 1}; }

std::vector<nlohmann::json> records(const std::string& file) {
  std::vector<nlohmann::json> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST(Status, WithoutADirectoryNothingIsWritten) {
  Writer w("", who());
  EXPECT_FALSE(w.enabled());
  EXPECT_EQ(w.path(), "");
  w.start();
  w.complete(4);
  w.relaunch(Reason::kFailure, "x");
  w.cut_off();  // no file, no crash
}

TEST(Status, RecordsAreOneObjectPerLineInTheProcesssOwnFile) {
  TempDir d;
  Writer w(d.path(), who());
  EXPECT_TRUE(w.enabled());
  EXPECT_EQ(w.path(), d.path() + "/node7-4242.jsonl");
  w.start();
  w.start();  // once
  w.set_step(41);
  w.relaunch(Reason::kRepairDeadline, "revoke and shrink (attempt 1) did not return within 8.0 s");
  w.cut_off();
  w.complete(3);
  const auto r = records(w.path());
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0]["event"], "start");
  EXPECT_FALSE(r[0].contains("step"));  // no step completed yet
  for (const auto& j : r) {
    EXPECT_EQ(j["host"], "node7");
    EXPECT_EQ(j["pid"], 4242);
    EXPECT_EQ(j["launch_rank"], 2);
    EXPECT_EQ(j["generation"], 1);
    EXPECT_GT(j["unix_time"].get<double>(), 1.7e9);
  }
  EXPECT_EQ(r[1]["event"], "relaunch");
  EXPECT_EQ(r[1]["reason"], "repair-deadline");
  EXPECT_EQ(r[1]["step"], 41);
  EXPECT_EQ(r[1]["detail"], "revoke and shrink (attempt 1) did not return within 8.0 s");
  EXPECT_EQ(r[2]["event"], "cut-off");
  EXPECT_EQ(r[3]["event"], "complete");
  EXPECT_EQ(r[3]["world_size"], 3);
}

TEST(Status, TheFirstRecordWritesTheStartFirst) {
  TempDir d;
  Writer w(d.path(), who());
  w.relaunch(Reason::kLauncherGone, "the launcher's process (pid 1) is gone");
  const auto r = records(w.path());
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0]["event"], "start");
  EXPECT_EQ(r[1]["reason"], "launcher-gone");
}

TEST(Status, EveryReasonHasItsDocumentedName) {
  using sinew::name_of;
  using sinew::status::kReasonNames;
  EXPECT_EQ(name_of(kReasonNames, Reason::kFailure), "failure");
  EXPECT_EQ(name_of(kReasonNames, Reason::kRepairDeadline), "repair-deadline");
  EXPECT_EQ(name_of(kReasonNames, Reason::kLauncherGone), "launcher-gone");
  EXPECT_EQ(name_of(kReasonNames, Reason::kMinRanks), "min-ranks");
  EXPECT_EQ(name_of(kReasonNames, Reason::kStopSignal), "stop-signal");
}

TEST(Status, ADetailThatIsNotUtf8IsRecordedNotThrown) {
  TempDir d;
  Writer w(d.path(), who());
  w.relaunch(Reason::kFailure, std::string("bad \xff\xfe path"));
  const auto r = records(w.path());
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1]["reason"], "failure");
}

TEST(Status, AMissingDirectoryIsNotCreatedAndDisablesTheWriter) {
  TempDir d;
  const std::string missing = d.path() + "/not-shared-here";
  Writer w(missing, who());
  testing::internal::CaptureStderr();
  w.start();
  w.complete(4);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_FALSE(w.enabled());
  EXPECT_FALSE(fs::exists(missing));
  EXPECT_NE(err.find("cannot write the launcher's status records"), std::string::npos) << err;
  EXPECT_EQ(err.find("cannot write", err.find("cannot write") + 1), std::string::npos)
      << "warned twice: " << err;
}

TEST(Status, ThreadsNeverTearALine) {
  TempDir d;
  Writer w(d.path(), who());
  const std::string detail(3000, 'x');  // long lines: a torn write would show
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 200; ++i) w.relaunch(Reason::kFailure, detail);
    });
  }
  for (auto& t : ts) t.join();
  const auto r = records(w.path());  // parse() throws on a torn line
  EXPECT_EQ(r.size(), 801u);
}

TEST(Status, ARecordWrittenJustBeforeExitIsThere) {
  // The repair watch's way out: a record from a thread, then _Exit(75) with other threads running.
  TempDir d;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Writer w(d.path(), who(0));
    std::thread busy([] {
      for (;;) std::this_thread::yield();
    });
    busy.detach();
    std::thread([&] {
      w.relaunch(Reason::kRepairDeadline, "shrink");
      std::_Exit(75);
    }).join();
  }
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 75);
  const auto r = records(d.path() + "/node7-4242.jsonl");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1]["reason"], "repair-deadline");
  EXPECT_EQ(r[1]["launch_rank"], 0);
}

TEST(Status, TheLauncherNamesTheDirectoryInTheEnvironment) {
  const auto l = sinew::launch::parse([](const char* name) -> const char* {
    return std::string(name) == sinew::status::kDirVariable ? "/shared/run/launch-3" : nullptr;
  });
  EXPECT_EQ(l.status_dir, "/shared/run/launch-3");
  EXPECT_EQ(sinew::launch::parse([](const char*) -> const char* { return nullptr; }).status_dir, "");
}
