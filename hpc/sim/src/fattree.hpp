// The fabric of a cluster: a fat tree (XGFT) as a SimGrid network zone of its own, with the topology,
// the links and the d-mod-k routing of SimGrid's FatTreeZone, built in time linear in the hosts.
//
// SimGrid's FatTreeZone (3.32) connects every node to its parents by testing it against every switch of
// the level above, building a std::stringstream per test: 8 million of them for 16 384 ranks, 2.6 s of
// every simulation at that size. Here a node's parents follow from its label. sim.py check runs the same
// simulations on both zones and requires the same results.
#pragma once

#include <string>
#include <vector>

#include <simgrid/kernel/routing/NetZoneImpl.hpp>
#include <simgrid/s4u.hpp>

namespace sinew::sim {

/// XGFT(h; m_1..m_h; w_1..w_h) with one cable between a node and each of its parents (FatTreeParams's
/// `number` all 1). Level 0 are the hosts, created by the caller (create_host on get_iface()) in
/// position order: a host's position is its netpoint's id in this zone. Leaves past the hosts created
/// stay empty. Every cable is a pair of links, one per direction (SimGrid's SPLITDUPLEX).
class FatTreeNetZone final : public simgrid::kernel::routing::NetZoneImpl {
 public:
  /// Throws std::invalid_argument for a topology SimGrid's FatTreeZone would not take either.
  FatTreeNetZone(const std::string& name, const simgrid::s4u::FatTreeParams& params);
  /// Creates the cables (after set_parent(), which gives the zone its network model), in the order
  /// SimGrid's FatTreeZone creates them.
  void create_links(double bandwidth, double latency);

  void get_local_route(const simgrid::kernel::routing::NetPoint* src,
                       const simgrid::kernel::routing::NetPoint* dst, simgrid::kernel::routing::Route* into,
                       double* latency) override;

 private:
  /// A node's label at `level` (digits least significant first; digit j counts w_j below `level`,
  /// m_j from it on) and back.
  void label_of(int level, long position, std::vector<int>& label) const;
  [[nodiscard]] long position_of(int level, const std::vector<int>& label) const;
  [[nodiscard]] int radix(int level, int digit) const { return digit < level ? up_[digit] : down_[digit]; }

  int levels_;
  std::vector<int> down_, up_;  ///< m_j, w_j
  std::vector<long> count_;     ///< nodes at each level, 0 (the leaves) to h
  double latency_ = 0;
  /// Per level l < h: the cable between node (l, position) and its parent through its up port u, at
  /// position * w_l + u; a link for each direction.
  std::vector<std::vector<simgrid::kernel::resource::StandardLinkImpl*>> up_links_, down_links_;
};

}  // namespace sinew::sim
