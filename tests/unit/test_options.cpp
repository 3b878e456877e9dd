// The elasticity options: fault specs and job-server schedules parse exactly, and bad ones are refused
// with a message naming the option (bad_input.sh checks the exit code of sinew-train).
#include <gtest/gtest.h>

#include "sinew/core/error.hpp"
#include "sinew/train/config.hpp"

namespace sinew::train {
namespace {

TEST(Options, ParseFault) {
  const auto f = parse_fault("2:allreduce:30");
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.phase, FaultPhase::kAllreduce);
  EXPECT_EQ(f.step, 30);
  EXPECT_EQ(parse_fault("0:checkpoint-write:1").phase, FaultPhase::kCheckpointWrite);
  for (const char* bad : {"", "2", "2:allreduce", "x:forward:3", "1:fly:3", "1:forward:0", "-1:forward:3",
                          "1:forward:3x", "1 :forward:3"}) {
    EXPECT_THROW((void)parse_fault(bad), InvalidArgument) << bad;
  }
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
  EXPECT_EQ(c.elastic, "inplace");
  EXPECT_NO_THROW(validate(c));
  c.min_ranks = 0;
  EXPECT_THROW(validate(c), InvalidArgument);
  c.min_ranks = 3;
  c.max_ranks = 2;
  EXPECT_THROW(validate(c), InvalidArgument);
  c.max_ranks = 4;
  c.lr_scaling = "cubic";
  EXPECT_THROW(validate(c), InvalidArgument);
}

}  // namespace
}  // namespace sinew::train
