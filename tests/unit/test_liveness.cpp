// The quorum rule of the failure detector (membership::Liveness): at most one side of any split of a group
// goes on, and a process alone with its own heartbeat never does (unless it is alone in the group).
#include <gtest/gtest.h>

#include "sinew/membership/liveness.hpp"

namespace {

using sinew::membership::has_quorum;

TEST(Liveness, AMajorityHasAQuorum) {
  EXPECT_TRUE(has_quorum(3, 4, false));
  EXPECT_TRUE(has_quorum(2, 3, false));
  EXPECT_TRUE(has_quorum(4, 4, true));
}

TEST(Liveness, AProcessCutOffAloneHasNone) {
  EXPECT_FALSE(has_quorum(1, 4, false));
  EXPECT_FALSE(has_quorum(1, 4, true));  // even rank 0: the three others go on
  EXPECT_FALSE(has_quorum(1, 3, true));
}

TEST(Liveness, AnEvenSplitGoesToTheHalfWithTheLowestRank) {
  EXPECT_TRUE(has_quorum(2, 4, true));
  EXPECT_FALSE(has_quorum(2, 4, false));
  EXPECT_TRUE(has_quorum(1, 2, true));
  EXPECT_FALSE(has_quorum(1, 2, false));
}

TEST(Liveness, NoSplitGivesBothSidesAQuorum) {
  for (int n = 1; n <= 64; ++n) {
    for (int a = 0; a <= n; ++a) {
      const int b = n - a;
      // The lowest rank is on exactly one side.
      for (bool lowest_in_a : {true, false}) {
        const bool qa = a > 0 && has_quorum(a, n, lowest_in_a);
        const bool qb = b > 0 && has_quorum(b, n, !lowest_in_a);
        EXPECT_FALSE(qa && qb) << n << " split " << a << "|" << b;
        if (a > 0 && b > 0) {
          EXPECT_TRUE(qa || qb) << n << " split " << a << "|" << b;
        }
      }
    }
  }
}

}  // namespace
