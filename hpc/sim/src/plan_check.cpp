// sinew-sim-plan-check --time R W ...: how long Sinew's plan_reshard (src/sinew/train/shards.cpp) takes on
// this machine for one failure at W members and R replicas (JSON on stdout; hpc/sim/plan_reshard_time.json,
// which sinew-sim charges as --plan-ms; docs/scale.md: its time is linear in W, W^2 before aa43fa3). The
// plan's correctness is tested with Sinew (tests/unit/test_shards.cpp); sinew-sim uses the same function.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sinew/train/shards.hpp"

using sinew::train::plan_reshard;
using sinew::train::ShardLayout;

int main(int argc, char** argv) {
  if (argc < 3 || std::string(argv[1]) != "--time") {
    std::fprintf(stderr, "usage: sinew-sim-plan-check --time R W...\n");
    return 2;
  }
  // One failure (the middle rank, as in the model's recoveries) at each W given, the MLP's parameters,
  // R replicas: the time of Sinew's plan_reshard on one member (at R = 1 it stops at the lost shard).
  const int r = std::atoi(argv[2]);
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
    const auto p = plan_reshard(ShardLayout(669706, w, r), old_rank, new_rank, ShardLayout(669706, w - 1, r));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    std::printf("%s\"%d\": %.6g", i > 3 ? ", " : "", w, s);
    std::fflush(stdout);
    if ((p.lost >= 0) != (r == 1)) return 1;
  }
  std::printf("}}\n");
  return 0;
}
