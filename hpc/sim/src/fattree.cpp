#include "fattree.hpp"

#include <stdexcept>

#include <simgrid/kernel/routing/NetPoint.hpp>

namespace sinew::sim {

namespace {
constexpr int kMaxLevels = 16;
}

FatTreeNetZone::FatTreeNetZone(const std::string& name, const simgrid::s4u::FatTreeParams& params)
    : NetZoneImpl(name), levels_(static_cast<int>(params.levels)) {
  const auto h = static_cast<std::size_t>(levels_);
  if (levels_ < 1 || levels_ > kMaxLevels || params.down.size() != h || params.up.size() != h ||
      params.number.size() != h)
    throw std::invalid_argument("fat tree: 1 to 16 levels, and a down, up and number count for each");
  for (std::size_t j = 0; j < h; ++j) {
    if (params.down[j] == 0 || params.up[j] == 0)
      throw std::invalid_argument("fat tree: every level needs at least one child and one parent");
    if (params.number[j] != 1)
      throw std::invalid_argument("fat tree: one cable between a node and each parent");
    down_.push_back(static_cast<int>(params.down[j]));
    up_.push_back(static_cast<int>(params.up[j]));
  }
  for (int level = 0; level <= levels_; ++level) {
    long n = 1;
    for (int j = 0; j < levels_; ++j) n *= radix(level, j);
    count_.push_back(n);
  }
}

void FatTreeNetZone::create_links(double bandwidth, double latency) {
  latency_ = latency;
  up_links_.resize(static_cast<std::size_t>(levels_));
  down_links_.resize(static_cast<std::size_t>(levels_));
  // Level by level, node by node, parent by parent, as SimGrid's FatTreeZone: links are the sharing
  // solver's constraints, and the same order makes the same solution.
  for (int level = 0; level < levels_; ++level) {
    const int w = up_[static_cast<std::size_t>(level)];
    auto& ups = up_links_[static_cast<std::size_t>(level)];
    auto& downs = down_links_[static_cast<std::size_t>(level)];
    ups.reserve(static_cast<std::size_t>(count_[static_cast<std::size_t>(level)] * w));
    downs.reserve(ups.capacity());
    for (long pos = 0; pos < count_[static_cast<std::size_t>(level)]; ++pos) {
      for (int u = 0; u < w; ++u) {
        std::string id = "l";  // (not "l" + to_string: GCC 12 warns on it, bug 105651)
        id += std::to_string(level) + ":" + std::to_string(pos) + ":" + std::to_string(u);
        ups.push_back(
            get_iface()->create_link(id + ":up", bandwidth)->set_latency(latency)->seal()->get_impl());
        downs.push_back(
            get_iface()->create_link(id + ":down", bandwidth)->set_latency(latency)->seal()->get_impl());
      }
    }
  }
}

void FatTreeNetZone::label_of(int level, long position, std::vector<int>& label) const {
  label.resize(static_cast<std::size_t>(levels_));
  for (int j = 0; j < levels_; ++j) {
    const int r = radix(level, j);
    label[static_cast<std::size_t>(j)] = static_cast<int>(position % r);
    position /= r;
  }
}

long FatTreeNetZone::position_of(int level, const std::vector<int>& label) const {
  long position = 0;
  for (int j = levels_ - 1; j >= 0; --j)
    position = position * radix(level, j) + label[static_cast<std::size_t>(j)];
  return position;
}

// SimGrid's FatTreeZone::get_local_route: up while the destination is not below the node, through the
// parent d-mod-k of the destination's position (its position divided by the parents per node of the
// levels below); then down through the child on the destination's label.
void FatTreeNetZone::get_local_route(const simgrid::kernel::routing::NetPoint* src,
                                     const simgrid::kernel::routing::NetPoint* dst,
                                     simgrid::kernel::routing::Route* into, double* latency) {
  if (src->is_router() || dst->is_router()) return;
  const auto t = static_cast<long>(dst->id());
  thread_local std::vector<int> node, dest;
  label_of(0, static_cast<long>(src->id()), node);
  label_of(0, t, dest);
  int level = 0;
  long pos = static_cast<long>(src->id());
  auto below = [&] {  // is the destination in the subtree of the node?
    if (level == 0) return false;
    for (int i = level; i < levels_; ++i) {
      if (node[static_cast<std::size_t>(i)] != dest[static_cast<std::size_t>(i)]) return false;
    }
    return true;
  };
  auto add = [&](simgrid::kernel::resource::StandardLinkImpl* link) {
    into->link_list_.push_back(link);
    if (latency != nullptr) *latency += latency_;
  };
  while (!below()) {
    long d = t;
    for (int i = 0; i < level; ++i) d /= up_[static_cast<std::size_t>(i)];
    const int w = up_[static_cast<std::size_t>(level)];
    d %= w;
    add(up_links_[static_cast<std::size_t>(level)][static_cast<std::size_t>(pos * w + d)]);
    node[static_cast<std::size_t>(level)] = static_cast<int>(d);
    ++level;
    pos = position_of(level, node);
  }
  while (level > 0) {
    const auto digit = static_cast<std::size_t>(level - 1);
    const int port = node[digit];  // the child's up port to this node
    node[digit] = dest[digit];
    --level;
    pos = position_of(level, node);
    add(down_links_[digit][static_cast<std::size_t>(pos * up_[digit] + port)]);
  }
}

}  // namespace sinew::sim
