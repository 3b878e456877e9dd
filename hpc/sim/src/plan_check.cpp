// sinew-sim-plan-check: the model's reshard plan (shard_plan.cpp) against Sinew's own plan_reshard
// (src/sinew/train/shards.cpp), piece by piece, over every failure of one or two members, a newcomer and a
// planned leave at 1 to 20 members and 1 to 4 replicas (the ctest sim.reshard_plan). With --time W ...,
// also how long Sinew's plan_reshard takes on this machine for one failure at W members and R replicas
// (--time R W ...; JSON on stdout; hpc/sim/plan_reshard_time.json; docs/scale.md: its time is linear in W,
// W^2 before aa43fa3).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "shard_plan.hpp"
#include "sinew/train/shards.hpp"

namespace {

using sinew::sim::plan_state;
using sinew::sim::ShardGeometry;
using sinew::train::plan_reshard;
using sinew::train::ShardLayout;

int failures = 0;

void compare(std::size_t total, int old_world, int replicas, const std::vector<int>& old_rank,
             const std::vector<int>& new_rank, int new_world, const std::string& what) {
  const auto real = plan_reshard(ShardLayout(total, old_world, replicas), old_rank, new_rank,
                                 ShardLayout(total, new_world, replicas));
  const auto ours =
      plan_state(ShardGeometry(static_cast<std::int64_t>(total), old_world, replicas), old_rank, new_rank,
                 ShardGeometry(static_cast<std::int64_t>(total), new_world, replicas));
  bool same = real.lost == ours.lost && real.pieces.size() == ours.pieces.size();
  if (real.lost < 0) same = same && real.source == ours.source;
  for (std::size_t i = 0; same && i < real.pieces.size(); ++i) {
    const auto& a = real.pieces[i];
    const auto& b = ours.pieces[i];
    same = a.from == b.from && a.to == b.to && a.to_shard == b.to_shard &&
           static_cast<std::int64_t>(a.range.offset) == b.offset &&
           static_cast<std::int64_t>(a.range.count) == b.count;
  }
  if (!same) {
    ++failures;
    if (failures <= 10) {
      std::fprintf(stderr,
                   "DIFFERENT: %s, %zu elements, %d -> %d members, R = %d: lost %d/%d, %zu/%zu pieces\n",
                   what.c_str(), total, old_world, new_world, replicas, real.lost, ours.lost,
                   real.pieces.size(), ours.pieces.size());
    }
  }
}

int check() {
  int cases = 0;
  for (std::size_t total : {std::size_t{7}, std::size_t{1000}, std::size_t{669706}}) {
    for (int w = 1; w <= 20; ++w) {
      for (int r = 1; r <= 4; ++r) {
        // No change, then every failure of one member and of two, a newcomer (a spare promoted or a
        // process spawned), and a planned leave of the last member (on the old view).
        std::vector<int> same(static_cast<std::size_t>(w));
        for (int i = 0; i < w; ++i) same[static_cast<std::size_t>(i)] = i;
        compare(total, w, r, same, same, w, "no change"), ++cases;
        for (int dead = 0; dead < w && w > 1; ++dead) {
          std::vector<int> old_rank, new_rank;
          for (int i = 0; i < w; ++i) {
            if (i == dead) continue;
            old_rank.push_back(i);
            new_rank.push_back(static_cast<int>(new_rank.size()));
          }
          compare(total, w, r, old_rank, new_rank, w - 1, "rank " + std::to_string(dead) + " failed"),
              ++cases;
          auto grown_old = old_rank, grown_new = new_rank;
          grown_old.push_back(-1);
          grown_new.push_back(w - 1);
          compare(total, w, r, grown_old, grown_new, w, "a newcomer for rank " + std::to_string(dead)),
              ++cases;
          for (int dead2 = dead + 1; dead2 < w && w > 2; ++dead2) {
            std::vector<int> o2, n2;
            for (int i = 0; i < w; ++i) {
              if (i == dead || i == dead2) continue;
              o2.push_back(i);
              n2.push_back(static_cast<int>(n2.size()));
            }
            compare(total, w, r, o2, n2, w - 2,
                    "ranks " + std::to_string(dead) + ", " + std::to_string(dead2)),
                ++cases;
          }
        }
        if (w > 1) {
          auto leave = same;
          leave.back() = -1;
          compare(total, w, r, same, leave, w - 1, "the last member leaves"), ++cases;
        }
      }
    }
  }
  std::printf("sinew-sim-plan-check: %d plans, %d different from Sinew's plan_reshard\n", cases, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--time") {
    // One failure (the middle rank, as in the model's recoveries) at each W given, the MLP's parameters,
    // R replicas: the time of Sinew's plan_reshard on one member (at R = 1 it stops at the lost shard).
    const int r = argc > 2 ? std::atoi(argv[2]) : 2;
    std::printf("{\"replicas\": %d, \"seconds\": {", r);
    for (int i = 3; i < argc; ++i) {
      const int w = std::atoi(argv[i]);
      std::vector<int> old_rank, new_rank;
      for (int q = 0; q < w; ++q) {
        if (q == w / 2) continue;
        old_rank.push_back(q);
        new_rank.push_back(static_cast<int>(new_rank.size()));
      }
      const auto t = std::chrono::steady_clock::now();
      const auto p =
          plan_reshard(ShardLayout(669706, w, r), old_rank, new_rank, ShardLayout(669706, w - 1, r));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      std::printf("%s\"%d\": %.6g", i > 3 ? ", " : "", w, s);
      std::fflush(stdout);
      if ((p.lost >= 0) != (r == 1)) return 1;
    }
    std::printf("}}\n");
    return 0;
  }
  return check();
}
