// The simulated cluster and the message patterns Sinew and its MPI library use on it. Everything here
// runs inside SimGrid actors: a call takes simulated time (transfers, computation, software costs).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <simgrid/s4u.hpp>

#include "sim.hpp"

namespace sinew::sim {

namespace sg4 = simgrid::s4u;

/// The hosts of one simulation: `ranks` compute hosts first, then `extra` idle nodes (spares, nodes to
/// spawn on), the parallel filesystem's servers and its metadata server, and the launcher (mpirun's host).
struct Cluster {
  std::vector<sg4::Host*> nodes;  ///< ranks, then extra nodes
  std::vector<sg4::Host*> pfs_servers;
  std::vector<sg4::Disk*> pfs_disks;
  sg4::Host* metadata = nullptr;
  sg4::Host* launcher = nullptr;
  const Platform* platform = nullptr;
  const Calibration* calibration = nullptr;
  Options options;
  double longest_path_s = 0;  ///< latency of the longest route between two nodes (up to the top and down)

  /// For the extrapolation of a sampled pattern: every member of collective `tag` (n of them) reports the
  /// time per iteration it measured; all wait for each other (no simulated time) and get the largest,
  /// so that they extrapolate alike at the pace of the slowest (also a plain barrier: `mine` 0).
  double max_over_members(const std::string& tag, int n, double mine) const;
  /// Per collective `tag`: when each member started each sampled step's send (members write their own
  /// slots; a receiver reads its sender's).
  std::vector<double>& send_times(const std::string& tag, int slots) const;

  /// The time a message of `bytes` takes from node `from` to node `to` on an otherwise idle fabric: its
  /// route's latency plus the bytes at the route's narrowest rate, as SimGrid's flow model (CM02, no
  /// cross traffic) times a flow that shares no link.
  [[nodiscard]] double message_s(int from, int to, double bytes) const;
  /// A collective of small messages computed instead of simulated (see computed_control()): every
  /// member of `tag` (n of them) reports the time it entered; once all have, `schedule` turns the
  /// entry times (by member) into the times each member leaves, and the calling member sleeps until its
  /// own. A member cannot leave before the last one entered (each one's result depends on all), so the
  /// wait for the others costs no simulated time of its own.
  void computed_collective(
      const std::string& tag, int n, int me,
      const std::function<std::vector<double>(const std::vector<double>&)>& schedule) const;

 private:
  struct Pooled {
    sg4::BarrierPtr barrier;
    double max = 0;
  };
  struct Computed {
    sg4::BarrierPtr barrier;
    std::vector<double> entered, leave;
    int left = 0;
  };
  mutable std::map<std::string, Pooled> pooled_;
  mutable std::map<std::string, std::vector<double>> send_times_;
  mutable std::map<std::string, Computed> computed_;

 public:
  /// On a fat tree: the hosts under one switch of each level (positions are node indices), so that
  /// message_s() can take a route's latency and rate from the first route seen at the same level (every
  /// route up to level l and down crosses 2l links of the same latency and rate) instead of asking
  /// SimGrid's routing for every message of the computed agreements.
  std::vector<long> leaves_under;

 private:
  mutable std::vector<std::pair<double, double>> route_by_level_;  ///< (latency, rate); rate 0: not yet
};

/// Whether the small messages of ULFM's agreements and of the shrink's allgather are computed from the
/// routes (Cluster::computed_collective) rather than simulated as flows: on a fabric when sampling
/// (Options::sample > 0) unless Options::simulate_control. Their 64 bytes to a few KiB share links with other
/// flows for nanoseconds, but each costs SimGrid an activity, a few actor switches and an update of its
/// sharing solver: at 16 384 ranks most of a recovery's simulation. On "local" they are simulated: there a
/// message's copy is CPU time that competes with the ranks' computation. The check (sim.py) compares both on
/// recoveries.
bool computed_control(const Cluster& c);

/// Builds the platform into `engine` for `nodes` rank hosts (fat tree, or the one host of "local").
std::unique_ptr<Cluster> build_cluster(sg4::Engine& engine, const Platform& p, const Calibration& c,
                                       int nodes, const Options& o);

/// The node index of each member of a group, shared by all its members' views (one copy per rank would
/// be n^2 integers: a gigabyte at 16 384 ranks).
using Members = std::shared_ptr<const std::vector<int>>;
inline Members make_members(std::vector<int> nodes) {
  return std::make_shared<const std::vector<int>>(std::move(nodes));
}

/// One rank's view of a group of ranks: its members' nodes and its own index. `seq` numbers the group's
/// collectives so that every call gets mailboxes of its own (all members call them in the same order).
struct Group {
  std::string name;
  Members members;
  int me = 0;
  int seq = 0;
  [[nodiscard]] int size() const { return static_cast<int>(members->size()); }
  std::string next_tag() { return name + "#" + std::to_string(seq++); }
};

// Costs of one rank's own work (the rank's host computes; CPU contention between ranks of "local").
void compute(const Cluster& c, double seconds);
void software(double seconds);  ///< a fixed software cost (not CPU-bound in the model)

// Point to point: the sender pays the platform's per-message overhead, then the transfer.
sg4::CommPtr send_async(const Cluster& c, const std::string& mailbox, double bytes);
// The transfer alone (the caller has paid the overhead).
sg4::CommPtr post_async(const Cluster& c, const std::string& mailbox, double bytes);
void recv(const std::string& mailbox);

// Collectives (every member calls them; each returns when this member is done).
void ring_allreduce(const Cluster& c, Group& g, double bytes);
void tree_allreduce(const Cluster& c, Group& g, double bytes);
void tree_broadcast(const Cluster& c, Group& g, int root, double bytes);
/// ByteGrad (algo/collectives.cpp): quantise, every block straight to its owner, owners sum and
/// re-quantise, then every owner's block straight to every rank; `bytes` of floats.
void bytegrad_allreduce(const Cluster& c, Group& g, double bytes);
/// ULFM's agreement (ERA): up and down a binary tree of small messages, `hop_s` per hop.
void agreement(const Cluster& c, Group& g, double hop_s);
/// Allgather of `item` bytes per member by recursive doubling (Bruck).
void small_allgather(const Cluster& c, Group& g, double item);
/// MPI_Iallgatherv as libnbc runs it (ompi/mca/coll/libnbc/nbc_iallgatherv.c): every member posts
/// n-1 receives and n-1 sends of its `bytes` in one round, an all-to-all (sampled as ByteGrad's is).
void allgather_linear(const Cluster& c, Group& g, double bytes);
/// MPI_Iallgatherv of uneven blocks as libnbc runs it (the same n-1 rounds): member q sends its `block(q)`
/// bytes to each of the n-1 others, a message each, zero-byte ones included (a ZeRO-3 unit's range, whose
/// blocks are the owners' of the shards it crosses). Sampled (Options::sample > 0 and more than 8 * sample
/// shifts, not on "local"): computed, not simulated. Every member leaves when the last has entered plus the
/// time the owner of the `largest` block takes to send it n-1 times at its link's rate (or to pay the n-1
/// overheads of posting, if longer) and the longest route's latency: the owners' NICs are the bottleneck
/// of this pattern on a non-blocking fabric (every member receives the unit, 1/owners of an owner's bytes).
/// What this leaves out is the overlap of consecutive gathers (see docs/scale.md).
void allgatherv_linear(const Cluster& c, Group& g, const std::function<double(int)>& block, double largest);
/// MPI_Ireduce_scatter as libnbc runs it (ompi/mca/coll/libnbc/nbc_ireduce_scatter.c): a binomial reduce of
/// the whole `bytes` to member 0 (ceil(log2 n) rounds, each a receive of the whole buffer and its sum), then
/// member 0 sends every other member its part, `part(q)` bytes, one message each in rank order (zero-byte
/// ones included). Sampled: the parts with bytes are flows, an empty one arrives one route's latency after
/// member 0 paid the overheads up to it (computed; the tiny messages would share links for nanoseconds).
void reduce_scatter_libnbc(const Cluster& c, Group& g, double bytes, const std::function<double(int)>& part);
/// One MPI_Ibcast after the other (Sinew's ShardedOptimizer::gather, and the parameters of a reshard):
/// broadcast i of `bytes[i]` from member `roots[i]`, each shaped as libnbc's (Open MPI's nonblocking
/// collectives, which Sinew's MPI backend calls): linear up to 4 members, a binomial tree below 64 KiB,
/// a chain in 8 KiB fragments below 512 KiB and in 32 KiB ones above. Sampled (Options::sample > 0): the
/// first max(4, sample) broadcasts simulated, the others at their pace.
void sequential_broadcasts(const Cluster& c, Group& g, const std::vector<int>& roots,
                           const std::vector<double>& bytes);
/// Point-to-point moves of a reshard's pieces: `messages` messages of `bytes` in all to or from `peer`.
struct Transfer {
  int peer = 0;
  int messages = 0;
  double bytes = 0;
};
/// Every member posts its receives, then its sends (the per-message overhead for each message; one flow
/// per peer), and waits for all (ShardedOptimizer::reshard's state pieces).
void exchange(const Cluster& c, Group& g, const std::vector<Transfer>& sends,
              const std::vector<Transfer>& recvs);
/// Reliable broadcast of a small message from `root` down a binomial tree (ULFM's revoke and failure
/// propagation); `hop_s` per forward.
void binomial_broadcast(const Cluster& c, Group& g, int root, double hop_s);

/// The runtime's daemon tree: vertex 0 is the launcher, vertex v >= 1 is node v-1. A daemon actor on
/// every vertex calls these with its vertex; `bytes_per_node` grows the messages of a gather.
void daemon_broadcast(const Cluster& c, const std::string& tag, int vertex, int vertices, double bytes);
void daemon_gather(const Cluster& c, const std::string& tag, int vertex, int vertices, double bytes_per_node);

/// Reads `bytes` of one file from the parallel filesystem into `node`, the reader-th of `readers` that
/// read it at once (every one of them calls this): one metadata open, then the stripes, read from the
/// servers' disks and sent over the fabric in parallel. On "local": page cache.
void pfs_read(const Cluster& c, int node, int file, double bytes, int reader, int readers);

}  // namespace sinew::sim
