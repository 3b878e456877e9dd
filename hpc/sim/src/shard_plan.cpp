#include "shard_plan.hpp"

#include <algorithm>
#include <stdexcept>

namespace sinew::sim {

ShardGeometry::ShardGeometry(std::int64_t total_, int world_, int replicas_)
    : total(total_), world(world_), replicas(std::clamp(replicas_, 1, std::max(world_, 1))) {
  if (world_ < 1) throw std::invalid_argument("a shard layout over fewer than 1 member");
}

bool ShardGeometry::holds(int rank, int s) const {
  if (rank < 0 || rank >= world) return false;
  const int d = (rank - s + world) % world;
  return d % stride() == 0 && d / stride() < replicas;
}

std::vector<int> ShardGeometry::held_by(int rank) const {
  std::vector<int> s;
  for (int k = 0; k < replicas; ++k) s.push_back(((rank - k * stride()) % world + world) % world);
  return s;
}

int ShardGeometry::shard_of(std::int64_t e) const {
  // begin(s) = floor(total s / world) is non-decreasing in s: the last s with begin(s) <= e and a
  // non-empty range. Start from the estimate and correct.
  int s = static_cast<int>(std::min<std::int64_t>(world - 1, total > 0 ? e * world / total : 0));
  while (s > 0 && begin(s) > e) --s;
  while (s + 1 < world && end(s) <= e) ++s;
  return s;
}

StatePlan plan_state(const ShardGeometry& old, const std::vector<int>& old_rank,
                     const std::vector<int>& new_rank, const ShardGeometry& next) {
  if (old_rank.size() != new_rank.size()) throw std::invalid_argument("plan over unequal member lists");
  StatePlan p;
  p.source.assign(static_cast<std::size_t>(old.world), -1);
  // The lowest member that holds each old shard: members in order, each claiming the shards it held
  // that no lower member claimed (as plan_reshard).
  for (std::size_t q = 0; q < old_rank.size(); ++q) {
    if (old_rank[q] < 0 || old_rank[q] >= old.world) continue;
    for (const int s : old.held_by(old_rank[q])) {
      int& src = p.source[static_cast<std::size_t>(s)];
      if (src < 0) src = static_cast<int>(q);
    }
  }
  for (int s = 0; s < old.world; ++s) {
    if (p.source[static_cast<std::size_t>(s)] < 0) {
      p.lost = s;
      return p;
    }
  }
  for (std::size_t qi = 0; qi < new_rank.size(); ++qi) {
    if (new_rank[qi] < 0) continue;
    const int q = static_cast<int>(qi);
    for (const int to_shard : next.held_by(new_rank[qi])) {
      const std::int64_t lo = next.begin(to_shard), hi = next.end(to_shard);
      if (hi <= lo) continue;
      // The old shards that overlap [lo, hi), in ascending order (as plan_reshard's loop over s).
      for (int s = old.shard_of(lo); s < old.world && old.begin(s) < hi; ++s) {
        const std::int64_t a = std::max(lo, old.begin(s)), b = std::min(hi, old.end(s));
        if (b <= a) continue;
        const int from = old.holds(old_rank[qi], s) ? q : p.source[static_cast<std::size_t>(s)];
        p.pieces.push_back({from, q, to_shard, a, b - a});
      }
    }
  }
  return p;
}

}  // namespace sinew::sim
