// The reshard's plan as Sinew computes it (src/sinew/train/shards.cpp: ShardLayout, plan_reshard), for the
// model: which member sends which piece of the optimiser state to which after a change of membership.
// The same arithmetic, visiting only the old shards that overlap a new one (as Sinew's plan_reshard has
// since it was made linear in the members, aa43fa3; it is written separately). Pure C++, no SimGrid:
// plan_check.cpp compiles it next to Sinew's own plan_reshard and requires the same pieces.
#pragma once

#include <cstdint>
#include <vector>

namespace sinew::sim {

/// Sinew's ShardLayout: `total` elements in `world` balanced contiguous shards, each held by `replicas`
/// members `stride` apart (s, s+stride, ... mod world; stride = world / replicas).
struct ShardGeometry {
  std::int64_t total = 0;
  int world = 1;
  int replicas = 1;  ///< min(--shard-replicas, world)
  ShardGeometry(std::int64_t total, int world, int replicas);
  [[nodiscard]] std::int64_t begin(int s) const { return total * s / world; }  ///< shard s: [begin, end)
  [[nodiscard]] std::int64_t end(int s) const { return total * (s + 1) / world; }
  [[nodiscard]] int stride() const { return world / replicas > 1 ? world / replicas : 1; }
  /// Whether member `rank` holds shard `s` (false for rank < 0: a newcomer holds nothing).
  [[nodiscard]] bool holds(int rank, int s) const;
  /// The shards `rank` holds, its own first: rank, rank - stride, ... (mod world).
  [[nodiscard]] std::vector<int> held_by(int rank) const;
  /// The shard that holds element e.
  [[nodiscard]] int shard_of(std::int64_t e) const;
};

/// One piece of a new holder's shard and who provides it (members of the communicator the reshard runs
/// over; from == to: the member keeps what it held, no message).
struct StatePiece {
  int from = 0, to = 0, to_shard = 0;
  std::int64_t offset = 0, count = 0;  ///< elements of the flat buffer
};

struct StatePlan {
  std::vector<int> source;  ///< per old shard: its lowest surviving holder (a member), or -1
  int lost = -1;            ///< the first old shard none of whose holders survived
  std::vector<StatePiece> pieces;
};

/// plan_reshard's result: `old_rank[q]` is member q's rank in `old` (-1: a newcomer), `new_rank[q]` its
/// rank in `next` (-1: it leaves). The pieces come in plan_reshard's order.
StatePlan plan_state(const ShardGeometry& old, const std::vector<int>& old_rank,
                     const std::vector<int>& new_rank, const ShardGeometry& next);

}  // namespace sinew::sim
