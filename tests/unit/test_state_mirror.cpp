// The node-local copy of the state (train/state_mirror.hpp): what a relaunch reads is the newest complete
// copy, never a torn one, and only into a state of the same layout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sinew/train/state_mirror.hpp"

namespace {

using sinew::NamedSpans;
using sinew::train::Position;
using sinew::train::StateMirror;

class StateMirrorTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sinew-mirror-test-" + std::to_string(::getpid()) + "-" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  /// A state at `step` whose every value is `v`.
  void fill(std::int64_t step, float v) {
    pos_.step = step;
    pos_.epoch = step / 10;
    pos_.cursor = step * 32;
    std::fill(params_.begin(), params_.end(), v);
    std::fill(momentum_.begin(), momentum_.end(), -v);
  }
  NamedSpans tensors() { return {{"params", params_}, {"optim/momentum", momentum_}}; }
  std::uint64_t layout() { return StateMirror::layout_hash(tensors(), 1000, 7); }

  /// Marks the slot that holds the copy of write `n` (1-based) as torn: its sequence number odd, as a
  /// writer that died in the middle leaves it.
  static void tear(const std::string& path, std::uint64_t n) {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    std::uint64_t seq[2] = {0, 0};  // Header::seq, after magic, layout and slot_bytes
    ASSERT_EQ(::pread(fd, seq, sizeof seq, 24), static_cast<ssize_t>(sizeof seq));
    const int slot = seq[0] == 2 * n ? 0 : 1;
    ASSERT_EQ(seq[slot], 2 * n) << "no slot holds write " << n;
    const std::uint64_t odd = 2 * n - 1;
    ASSERT_EQ(::pwrite(fd, &odd, sizeof odd, 24 + 8 * slot), static_cast<ssize_t>(sizeof odd));
    ::close(fd);
  }

  std::filesystem::path dir_;
  Position pos_;
  std::vector<float> params_ = std::vector<float>(1000);
  std::vector<float> momentum_ = std::vector<float>(1000);
};

TEST_F(StateMirrorTest, ARelaunchReadsTheNewestCompleteCopy) {
  {
    StateMirror m(dir_.string(), layout());
    EXPECT_FALSE(m.newest());  // nothing written yet
    for (std::int64_t s = 1; s <= 5; ++s) {
      fill(s, static_cast<float>(s));
      ASSERT_TRUE(m.write(pos_, tensors()));
    }
  }  // the writer is gone (as after a failure); the file stays
  StateMirror later(dir_.string(), layout());
  ASSERT_EQ(later.newest(), 5);
  fill(0, 0.f);
  Position p;
  ASSERT_TRUE(later.read(p, tensors()));
  EXPECT_EQ(p.step, 5);
  EXPECT_EQ(p.epoch, 0);
  EXPECT_EQ(p.cursor, 160);
  EXPECT_EQ(params_.front(), 5.f);
  EXPECT_EQ(params_.back(), 5.f);
  EXPECT_EQ(momentum_.back(), -5.f);
}

TEST_F(StateMirrorTest, ATornCopyIsNeverReadAndIsTheFirstToBeWrittenOver) {
  StateMirror m(dir_.string(), layout());
  for (std::int64_t s = 1; s <= 2; ++s) {
    fill(s, static_cast<float>(s));
    ASSERT_TRUE(m.write(pos_, tensors()));
  }
  tear(m.path(), 2);  // the writer of step 2 died in the middle of its copy
  StateMirror reader(dir_.string(), layout());
  ASSERT_EQ(reader.newest(), 1);
  Position p;
  ASSERT_TRUE(reader.read(p, tensors()));
  EXPECT_EQ(p.step, 1);
  EXPECT_EQ(params_[17], 1.f);
  // A new writer (the relaunch) writes over the torn slot, not over step 1's copy; should it die too, step 1
  // is still there.
  StateMirror next(dir_.string(), layout());
  fill(3, 3.f);
  ASSERT_TRUE(next.write(pos_, tensors()));
  EXPECT_EQ(reader.newest(), 3);
  tear(next.path(), 3);
  EXPECT_EQ(reader.newest(), 1);
}

TEST_F(StateMirrorTest, AnotherLayoutIsNotRead) {
  StateMirror m(dir_.string(), layout());
  fill(4, 4.f);
  ASSERT_TRUE(m.write(pos_, tensors()));
  StateMirror other_seed(dir_.string(), StateMirror::layout_hash(tensors(), 1000, 8));
  EXPECT_FALSE(other_seed.newest());
  std::vector<float> bigger(1001);
  NamedSpans other{{"params", bigger}, {"optim/momentum", momentum_}};
  StateMirror other_model(dir_.string(), StateMirror::layout_hash(other, 1000, 7));
  EXPECT_FALSE(other_model.newest());
  Position p;
  EXPECT_FALSE(other_model.read(p, other));
  // Written over by the other layout's writer: the file is made afresh for it.
  std::fill(bigger.begin(), bigger.end(), 9.f);
  Position q;
  q.step = 9;
  ASSERT_TRUE(other_model.write(q, other));
  EXPECT_EQ(other_model.newest(), 9);
  EXPECT_FALSE(m.newest());
}

TEST_F(StateMirrorTest, AMirrorThatCannotBeMadeWritesNothingAndSaysSo) {
  const auto blocker = dir_;
  std::filesystem::create_directories(blocker.parent_path());
  { std::ofstream(blocker.string()) << "a file where the directory should be"; }
  StateMirror m((blocker / "sub").string(), layout());
  fill(1, 1.f);
  EXPECT_FALSE(m.write(pos_, tensors()));
  EXPECT_FALSE(m.write(pos_, tensors()));  // and does not try again
  EXPECT_FALSE(m.newest());
  std::filesystem::remove(blocker);
}

TEST_F(StateMirrorTest, RemoveLeavesNothingBehind) {
  StateMirror m(dir_.string(), layout());
  fill(1, 1.f);
  ASSERT_TRUE(m.write(pos_, tensors()));
  ASSERT_TRUE(std::filesystem::exists(m.path()));
  m.remove();
  EXPECT_FALSE(std::filesystem::exists(m.path()));
  EXPECT_FALSE(m.write(pos_, tensors()));
}

}  // namespace
