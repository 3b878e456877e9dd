// The sharded optimiser state's layout and its reshard plan (train/shards.hpp): who holds what, and what
// moves where when members fail, join or leave.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <vector>

#include "sinew/optim/optimizer.hpp"
#include "sinew/train/shards.hpp"

namespace sinew::train {
namespace {

TEST(ShardLayout, BalancedContiguousShardsCoverTheBuffer) {
  const ShardLayout l(10, 4, 2);
  std::size_t next = 0;
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(l.shard(s).offset, next);
    EXPECT_GE(l.shard(s).count, 2u);
    EXPECT_LE(l.shard(s).count, 3u);
    next = l.shard(s).end();
  }
  EXPECT_EQ(next, 10u);
}

TEST(ShardLayout, ShardOfAnElementIsTheOneThatContainsIt) {
  // Uneven shards, and more shards than elements (empty shards share their offset with the next one).
  for (const auto& [total, world] :
       {std::pair<std::size_t, int>{10, 4}, {1000003, 7}, {2, 4}, {5, 16}, {16384, 16384}}) {
    const ShardLayout l(total, world, 2);
    for (std::size_t e = 0; e < total; e += 1 + total / 997) {
      const Slice s = l.shard(l.shard_of(e));
      ASSERT_TRUE(e >= s.offset && e < s.end()) << e << " of " << total << " over " << world;
    }
  }
}

TEST(ShardLayout, EachShardHasReplicasHoldersSpreadOverTheRing) {
  const ShardLayout l(100, 5, 2);  // stride 5 / 2 = 2
  EXPECT_EQ(l.holders(4), (std::vector<int>{4, 1}));
  EXPECT_EQ(l.held_by(0), (std::vector<int>{0, 3}));
  // Consecutive ranks (one node's, as launchers place them) never hold the same shard at 4 ranks, R = 2.
  const ShardLayout four(100, 4, 2);
  for (int r = 0; r < 4; ++r)
    for (const int s : four.held_by(r)) {
      const auto next = four.held_by((r + 1) % 4);
      EXPECT_EQ(std::find(next.begin(), next.end(), s), next.end()) << "ranks " << r << " and " << r + 1;
    }
  for (int s = 0; s < 5; ++s)
    for (const int r : l.holders(s)) {
      const auto h = l.held_by(r);
      EXPECT_NE(std::find(h.begin(), h.end(), s), h.end()) << "shard " << s << " rank " << r;
    }
}

TEST(ShardLayout, ReplicasAreCappedByTheWorld) {
  EXPECT_EQ(ShardLayout(100, 1, 2).replicas, 1);
  EXPECT_EQ(ShardLayout(100, 3, 8).held_by(1).size(), 3u);
}

// Every element of every new holder's shards arrives exactly once, from a member that held it.
void expect_complete(const ShardLayout& old, const std::vector<int>& old_rank,
                     const std::vector<int>& new_rank, const ShardLayout& next, const ReshardPlan& p) {
  ASSERT_EQ(p.lost, -1);
  for (std::size_t q = 0; q < new_rank.size(); ++q) {
    if (new_rank[q] < 0) continue;
    for (const int s : next.held_by(new_rank[q])) {
      std::vector<int> got(next.shard(s).count, 0);
      for (const auto& piece : p.pieces) {
        if (piece.to != static_cast<int>(q) || piece.to_shard != s) continue;
        // The sender held the piece in the old layout.
        const int from_old = old_rank[static_cast<std::size_t>(piece.from)];
        ASSERT_GE(from_old, 0);
        bool held = false;
        for (const int os : old.held_by(from_old)) {
          const Slice r = old.shard(os);
          held = held || (piece.range.offset >= r.offset && piece.range.end() <= r.end());
        }
        EXPECT_TRUE(held) << "piece from member " << piece.from << " that did not hold it";
        for (std::size_t e = piece.range.offset; e < piece.range.end(); ++e) ++got[e - next.shard(s).offset];
      }
      for (const int c : got) EXPECT_EQ(c, 1) << "new member " << q << " shard " << s;
    }
  }
}

TEST(ReshardPlan, OneFailureAtReplicasTwoLosesNothing) {
  const ShardLayout old(1000, 4, 2), next(1000, 3, 2);
  for (int dead = 0; dead < 4; ++dead) {
    std::vector<int> old_rank;
    for (int r = 0; r < 4; ++r)
      if (r != dead) old_rank.push_back(r);
    std::vector<int> new_rank{0, 1, 2};
    const ReshardPlan p = plan_reshard(old, old_rank, new_rank, next);
    expect_complete(old, old_rank, new_rank, next, p);
  }
}

TEST(ReshardPlan, TwoFailuresOfDifferentShardsAtReplicasTwo) {
  // Ranks 0 and 1 (a node's two ranks) die: shards 0 and 1 are also on 2 and 3.
  const ShardLayout old(999, 4, 2), next(999, 2, 2);
  const std::vector<int> old_rank{2, 3}, new_rank{0, 1};
  expect_complete(old, old_rank, new_rank, next, plan_reshard(old, old_rank, new_rank, next));
}

TEST(ReshardPlan, BothHoldersOfAShardLostIsNamed) {
  // Ranks 1 and 3 hold shard 1 (owner 1, replica 3): both dead.
  const ShardLayout old(100, 4, 2), next(100, 2, 2);
  const ReshardPlan p = plan_reshard(old, {0, 2}, {0, 1}, next);
  EXPECT_EQ(p.lost, 1);
  EXPECT_TRUE(p.pieces.empty());
}

TEST(ReshardPlan, NoRedundancyLosesTheDeadRanksShard) {
  const ShardLayout old(100, 4, 1), next(100, 3, 1);
  EXPECT_EQ(plan_reshard(old, {0, 1, 3}, {0, 1, 2}, next).lost, 2);
}

TEST(ReshardPlan, NewcomersReceiveEverythingTheyHold) {
  // Shrunk to 3, then grown back to 4 by a spawned replacement (old rank -1) at the end.
  const ShardLayout old(1001, 3, 2), next(1001, 4, 2);
  const std::vector<int> old_rank{0, 1, 2, -1}, new_rank{0, 1, 2, 3};
  const ReshardPlan p = plan_reshard(old, old_rank, new_rank, next);
  expect_complete(old, old_rank, new_rank, next, p);
  for (const auto& piece : p.pieces) EXPECT_NE(piece.from, 3);
}

TEST(ReshardPlan, LeavingMembersHandOverEvenWithoutRedundancy) {
  // Over the old view: ranks 1 and 2 leave (new rank -1), with replicas 1 nothing else holds their shards.
  const ShardLayout old(500, 4, 1), next(500, 2, 1);
  const std::vector<int> old_rank{0, 1, 2, 3}, new_rank{0, -1, -1, 1};
  const ReshardPlan p = plan_reshard(old, old_rank, new_rank, next);
  expect_complete(old, old_rank, new_rank, next, p);
  for (const auto& piece : p.pieces) EXPECT_TRUE(piece.to == 0 || piece.to == 3);
}

TEST(ReshardPlan, AMemberKeepsWhatItHeldWithoutAMessage) {
  // Unchanged membership: every piece stays where it is.
  const ShardLayout l(700, 4, 2);
  const ReshardPlan p = plan_reshard(l, {0, 1, 2, 3}, {0, 1, 2, 3}, l);
  for (const auto& piece : p.pieces) EXPECT_EQ(piece.from, piece.to);
}

// The update of a shard is the update of the same range of the whole buffer: sharding changes no bit.
TEST(ShardedOptimizer, ShardsStepLikeTheWholeOptimiser) {
  for (const char* name : {"sgd", "adam"}) {
    optim::OptimizerOptions o;
    o.name = name;
    o.weight_decay = 0.01f;
    const std::size_t n = 1237;
    std::vector<float> p(n), g(n);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = std::sin(static_cast<float>(i));
      g[i] = std::cos(static_cast<float>(3 * i)) * 0.1f;
    }
    auto whole = optim::make_optimizer(o, n);
    std::vector<float> pw = p;
    std::vector<std::vector<float>> ps(4, p);
    std::vector<std::unique_ptr<ShardedOptimizer>> members;
    for (int r = 0; r < 4; ++r) {
      members.push_back(std::make_unique<ShardedOptimizer>(o, n, 2));
      members.back()->arrange(r, 4);
    }
    for (int step = 0; step < 5; ++step) {
      whole->step(pw, g, 0.01f);
      for (int r = 0; r < 4; ++r)
        members[static_cast<std::size_t>(r)]->step(ps[static_cast<std::size_t>(r)], g, 0.01f);
    }
    // Each member's own and replica shards equal the whole optimiser's parameters and state there.
    for (int r = 0; r < 4; ++r) {
      const auto& m = *members[static_cast<std::size_t>(r)];
      EXPECT_EQ(m.steps(), 5);
      for (const auto& h : m.held()) {
        for (std::size_t i = h.range.offset; i < h.range.end(); ++i)
          ASSERT_EQ(ps[static_cast<std::size_t>(r)][i], pw[i]) << name << " member " << r << " element " << i;
        const auto ws = whole->state();
        const auto hs = h.opt->state();
        ASSERT_EQ(ws.size(), hs.size());
        for (std::size_t k = 0; k < ws.size(); ++k)
          for (std::size_t i = 0; i < h.range.count; ++i)
            ASSERT_EQ(hs[k].second[i], ws[k].second[h.range.offset + i]) << name << " state " << ws[k].first;
      }
    }
  }
}

}  // namespace
}  // namespace sinew::train
