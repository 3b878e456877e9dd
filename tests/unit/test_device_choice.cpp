// Which GPU each member of a view takes (train/device.hpp): a member keeps its GPU, a newcomer (a spawned
// replacement, a promoted spare) takes a free one on its node, never one a survivor holds.
#include <gtest/gtest.h>

#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/train/device.hpp"

namespace {

using sinew::train::DeviceClaim;
using sinew::train::pick_device;

std::vector<int> pick_all(const std::vector<DeviceClaim>& claims, int count) {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(claims.size()); ++r) out.push_back(pick_device(claims, r, count));
  return out;
}

TEST(DeviceChoice, LaunchTakesOneGpuPerMemberInRankOrderPerNode) {
  // Two nodes (host hashes 1 and 2) of two GPUs, ranks interleaved across them.
  const std::vector<DeviceClaim> claims{{1, -1}, {2, -1}, {1, -1}, {2, -1}};
  EXPECT_EQ(pick_all(claims, 2), (std::vector<int>{0, 0, 1, 1}));
}

TEST(DeviceChoice, ReplacementTakesTheGpuItsPredecessorLeftFree) {
  // Rank 1 of four on one node (GPU 1) died; the survivors keep 0, 2, 3 and the replacement comes last.
  const std::vector<DeviceClaim> claims{{7, 0}, {7, 2}, {7, 3}, {7, -1}};
  EXPECT_EQ(pick_all(claims, 4), (std::vector<int>{0, 2, 3, 1}));
}

TEST(DeviceChoice, TwoReplacementsTakeTheFreeGpusInRankOrder) {
  const std::vector<DeviceClaim> claims{{7, 3}, {7, 0}, {7, -1}, {7, -1}};
  EXPECT_EQ(pick_all(claims, 4), (std::vector<int>{3, 0, 1, 2}));
}

TEST(DeviceChoice, GpusOfOtherNodesDoNotCount) {
  const std::vector<DeviceClaim> claims{{1, 0}, {2, 0}, {2, -1}};
  EXPECT_EQ(pick_all(claims, 2), (std::vector<int>{0, 0, 1}));
}

TEST(DeviceChoice, MoreMembersThanGpusShareThem) {
  const std::vector<DeviceClaim> claims{{1, -1}, {1, -1}, {1, -1}};
  EXPECT_EQ(pick_all(claims, 2), (std::vector<int>{0, 1, 0}));
}

TEST(DeviceChoice, NoGpuIsAClearError) {
  const std::vector<DeviceClaim> claims{{1, -1}};
  try {
    (void)pick_device(claims, 0, 0);
    FAIL() << "expected InvalidArgument";
  } catch (const sinew::InvalidArgument& e) {
    EXPECT_NE(e.message().find("needs a CUDA GPU"), std::string::npos) << e.message();
  }
}

}  // namespace
