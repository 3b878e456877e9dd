// The elasticity options: fault specs and job-server schedules parse exactly, and bad ones are refused
// with a message naming the option (bad_input.sh checks the exit code of sinew-train).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/train/config.hpp"

namespace sinew::train {
namespace {

TEST(Options, ParseFault) {
  const auto f = fault::parse_fault("2:allreduce:30");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.point, fault::Point::kAllreduce);
  EXPECT_EQ(f.step, 30);
  EXPECT_EQ(fault::parse_fault("0:checkpoint-write:1").point, fault::Point::kCheckpointWrite);
  EXPECT_EQ(fault::parse_fault("1:before-rename:10").point, fault::Point::kBeforeRename);
  for (const char* bad : {"", "2", "2:allreduce", "x:forward:3", "1:fly:3", "1:forward:0", "-1:forward:3",
                          "1:forward:3x", "1 :forward:3", "1:before-rename:"}) {
    EXPECT_THROW((void)fault::parse_fault(bad), InvalidArgument) << bad;
  }
  try {
    (void)fault::parse_fault("1:fly:3");
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--inject-fault"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("before-manifest"), std::string::npos) << e.what();
  }
}

TEST(Options, FaultsParsedOnceWithTheOptions) {
  const char* argv[] = {"sinew-train", "--inject-fault", "2:forward:5", "--inject-fault",
                        "0:before-fsync:10"};
  const auto r = parse_command_line(5, argv);
  ASSERT_TRUE(r.config);
  ASSERT_EQ(r.config->inject_fault.size(), 2u);
  EXPECT_EQ(r.config->inject_fault[1].point, fault::Point::kBeforeFsync);
  const char* bad[] = {"sinew-train", "--inject-fault", "2:fly:5"};
  EXPECT_THROW((void)parse_command_line(3, bad), InvalidArgument);
}

TEST(Options, PlanKeepsThisProcessFaultsOnly) {
  // A plan holds only its launch rank's faults, and none at all in a relaunch: at() must not kill here.
  const std::vector<fault::Fault> faults = {{1, fault::Point::kForward, 3}};
  EXPECT_TRUE(fault::Plan(faults, 0, 0).empty());
  EXPECT_TRUE(fault::Plan(faults, 1, 1).empty());
  EXPECT_TRUE(fault::Plan(faults, -1, 0).empty());
  EXPECT_FALSE(fault::Plan(faults, 1, 0).empty());
  fault::Plan(faults, 1, 0).at(fault::Point::kBackward, 3);  // another point: survives
  fault::Plan(faults, 1, 0).at(fault::Point::kForward, 4);   // another step: survives
}

TEST(Options, ParseResizeSchedule) {
  const auto s = parse_resize_schedule("10:2,20:4,35:3");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[1], (std::pair<std::int64_t, int>{20, 4}));
  EXPECT_TRUE(parse_resize_schedule("").empty());
  for (const char* bad : {"10", "10:0", "0:2", "10:2,5:3", "10:2,10:3", "a:b", "10:2x"}) {
    EXPECT_THROW((void)parse_resize_schedule(bad), InvalidArgument) << bad;
  }
}

TEST(Options, ElasticDefaultsValidate) {
  Config c;
  EXPECT_EQ(c.elastic, ElasticMode::kInplace);
  EXPECT_NO_THROW(validate(c));
  c.min_ranks = 0;
  EXPECT_THROW(validate(c), InvalidArgument);
  c.min_ranks = 3;
  c.max_ranks = 2;
  EXPECT_THROW(validate(c), InvalidArgument);
}

TEST(Options, ChoicesAreTyped) {
  const char* argv[] = {"sinew-train", "--elastic", "restart", "--lr-scaling", "sqrt"};
  const auto r = parse_command_line(5, argv);
  ASSERT_TRUE(r.config);
  EXPECT_EQ(r.config->elastic, ElasticMode::kRestart);
  EXPECT_EQ(r.config->lr_scaling, LrScaling::kSqrt);
  const char* bad[] = {"sinew-train", "--lr-scaling", "cubic"};
  try {
    (void)parse_command_line(3, bad);
    ADD_FAILURE() << "--lr-scaling cubic was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("--lr-scaling: unknown value 'cubic'; use one of none, linear, sqrt"),
        std::string::npos)
        << e.what();
  }
}

/// --device cuda refuses what would silently run on the host, naming the option and what to use.
TEST(Options, DeviceCudaRefusesCpuOnlyChoices) {
  struct Case {
    std::vector<const char*> args;
    const char* needle;
  };
  const std::vector<Case> cases{
      {{"--algorithm", "decentralized"}, "--algorithm decentralized runs on the CPU only"},
      {{"--model", "cnn"}, "supports the models logreg and mlp"},
      {{"--allreduce", "ring"}, "--allreduce ring runs on the CPU only"},
      {{"--algorithm", "bytegrad", "--error-feedback", "true"}, "--error-feedback runs on the CPU only"},
      {{}, nullptr},  // the plain run: accepted with CUDA support
  };
  for (const auto& c : cases) {
    std::vector<const char*> argv{"sinew-train", "--device", "cuda"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    std::string refused;  // parse_command_line validates
    try {
      (void)parse_command_line(static_cast<int>(argv.size()), argv.data());
    } catch (const InvalidArgument& e) {
      refused = e.message();
    }
    if (SINEW_HAVE_CUDA == 0) {  // a CPU-only build refuses --device cuda itself
      EXPECT_NE(refused.find("no GPU support"), std::string::npos) << refused;
    } else if (c.needle == nullptr) {
      EXPECT_EQ(refused, "");
    } else {
      EXPECT_NE(refused.find(c.needle), std::string::npos) << "for " << c.needle << ": " << refused;
    }
  }
}

}  // namespace
}  // namespace sinew::train
