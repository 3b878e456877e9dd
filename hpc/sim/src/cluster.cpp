#include "cluster.hpp"

#include "fattree.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include <xbt/config.hpp>

namespace sinew::sim {

namespace {

constexpr double kFlops = 1e9;  // a host of speed 1 does 1e9 "flops" a second: seconds of work * kFlops
int payload = 0;                // messages carry no data, only their simulated size
int* received = nullptr;        // where the payload pointer of a received message goes

int ceil_div(long a, long b) { return static_cast<int>((a + b - 1) / b); }

// The XGFT description of the smallest fat tree of `radix`-port switches with at least `leaves` leaves:
// every switch below the top has radix/2 ports down and radix/2 up (the leaf switches' uplinks divided
// by `taper`), the top switches use all their ports down.
sg4::FatTreeParams fat_tree(int leaves, int radix, double taper) {
  const auto half = static_cast<unsigned>(radix / 2);
  const auto edge_up = static_cast<unsigned>(std::max(1L, std::lround(half / taper)));
  if (leaves <= static_cast<int>(half)) return {1, {static_cast<unsigned>(leaves)}, {1}, {1}};
  std::vector<unsigned> down, up, number;
  long below = 1;  // leaves under one switch of the level being added
  for (;;) {
    const long top = ceil_div(leaves, below);  // children a top switch would need
    if (top <= radix) {
      down.push_back(static_cast<unsigned>(top));
      up.push_back(down.size() == 1 ? 1 : (down.size() == 2 ? edge_up : half));
      number.push_back(1);
      break;
    }
    down.push_back(half);
    up.push_back(down.size() == 1 ? 1 : (down.size() == 2 ? edge_up : half));
    number.push_back(1);
    below *= half;
  }
  return {static_cast<unsigned>(down.size()), down, up, number};
}

std::string mailbox(const std::string& tag, int a) { return tag + ":" + std::to_string(a); }
std::string mailbox(const std::string& tag, int a, int b) {
  return mailbox(tag, a) + ":" + std::to_string(b);
}

void wait_all(std::vector<sg4::CommPtr>& comms) {
  for (auto& c : comms) c->wait();
  comms.clear();
}

// The exchange pattern of ByteGrad's two stages: every member sends `bytes` to every other member. As
// algo/collectives.cpp does, a member posts all its receives first, then its sends one after the other
// (paying the per-message overhead each), and waits for all of them.
//
// Sampled (options.sample > 0 and more shifts than that): the n-1 shifts are cut into `sample` groups of
// consecutive shifts, and each group goes as one message of the group's bytes to the member at the
// group's middle shift. Every link carries the bytes of the full exchange, spread over the distances of
// the full exchange, but SimGrid shares bandwidth among sample*n flows instead of n^2 (its solver's work
// grows with their square). What the groups do not show, the sender's overhead for each of its n-1
// messages, bounds the exchange from below: the last message leaves after (n-1) overheads and still has
// to cross the network. The check (sim.py) compares sampled with full simulations.
void all_to_all(const Cluster& c, Group& g, double bytes) {
  const int n = g.size();
  if (n < 2) return;
  const std::string tag = g.next_tag();
  const int shifts = n - 1;
  const bool sampled = c.options.sample > 0 && c.options.sample < shifts;
  const int messages = sampled ? c.options.sample : shifts;
  const double t0 = sg4::Engine::get_clock();
  // Message j: shifts [first(j), first(j + 1)), sent to the member at the middle one (one shift each
  // when not sampled).
  auto first = [&](int j) { return 1 + static_cast<int>(static_cast<long>(j) * shifts / messages); };
  std::vector<sg4::CommPtr> comms;
  comms.reserve(2 * static_cast<std::size_t>(messages));
  for (int j = 0; j < messages; ++j)
    comms.push_back(sg4::Mailbox::by_name(mailbox(tag, g.me, j))->get_async<int>(&received));
  // Sampled, the groups are posted together after one overhead: a group's real messages leave one
  // overhead apart over `count` overheads, which the bound below charges, and posting the groups one
  // overhead apart was no closer to that. It made every post an event of SimGrid's sharing solver, whose
  // all-to-all flows are all coupled through the fabric: 3x the simulation's time for the same result.
  if (sampled) software(c.platform->overhead_s);
  for (int j = 0; j < messages; ++j) {
    const int count = first(j + 1) - first(j), shift = first(j) + count / 2;
    const std::string to = mailbox(tag, (g.me + shift) % n, j);
    comms.push_back(sampled ? post_async(c, to, bytes * count) : send_async(c, to, bytes * count));
  }
  wait_all(comms);
  if (sampled) {
    const double posted =
        t0 + shifts * c.platform->overhead_s + c.longest_path_s + bytes / c.platform->link_Bps;
    if (posted > sg4::Engine::get_clock()) sg4::this_actor::sleep_until(posted);
  }
}

}  // namespace

std::unique_ptr<Cluster> build_cluster(sg4::Engine& engine, const Platform& p, const Calibration& cal,
                                       int nodes, const Options& o) {
  auto c = std::make_unique<Cluster>();
  c->platform = &p;
  c->calibration = &cal;
  c->options = o;
  auto* root = sg4::create_full_zone("world");
  if (p.local) {
    // One machine: a host per core, the ranks placed on them in turn (3 ranks on 2 cores: two share
    // core 0, and their lockstep with the third goes at their pace, as measured). Messages go through
    // memory: the loopback within a core, a link of the machine's latency between cores (configured by
    // main() from the calibration); the copy is the sender's CPU time, charged by send_async().
    std::vector<sg4::Host*> cores;
    cores.reserve(static_cast<std::size_t>(p.cores));
    for (int i = 0; i < p.cores; ++i)
      cores.push_back(root->create_host("core" + std::to_string(i), kFlops)->seal());
    const sg4::Link* memory = root->create_link("memory", 1e15)->set_latency(p.link_latency_s)->seal();
    for (int i = 0; i < p.cores; ++i) {
      for (int j = i + 1; j < p.cores; ++j) {
        root->add_route(cores[static_cast<std::size_t>(i)]->get_netpoint(),
                        cores[static_cast<std::size_t>(j)]->get_netpoint(), nullptr, nullptr,
                        {sg4::LinkInRoute(memory)}, true);
      }
    }
    for (int r = 0; r < nodes; ++r) c->nodes.push_back(cores[static_cast<std::size_t>(r % p.cores)]);
    c->metadata = c->launcher = cores[0];
    c->longest_path_s = p.link_latency_s;
    root->seal();
    (void)engine;
    return c;
  }
  const int servers = p.pfs.servers;
  const int leaves = nodes + servers + 2;
  std::vector<sg4::Host*> hosts(static_cast<std::size_t>(leaves), nullptr);
  const sg4::FatTreeParams tree = fat_tree(leaves, p.radix, p.taper);
  c->longest_path_s = 2.0 * static_cast<double>(tree.levels) * p.link_latency_s;  // up to the top, down
  for (long under = 1; const unsigned d : tree.down) c->leaves_under.push_back(under *= static_cast<long>(d));
  sg4::NetZone* zone = nullptr;
  if (o.simgrid_fat_tree) {
    zone = sg4::create_fatTree_zone(
        "fabric", root, tree,
        sg4::ClusterCallbacks([&](sg4::NetZone* z, const std::vector<unsigned long>& /*coord*/,
                                  unsigned long id) {
          // Leaves past `leaves` (the tree is rounded up to whole switches) stay idle.
          std::string name = static_cast<int>(id) < leaves ? "h" : "idle";
          name += std::to_string(id);
          sg4::Host* h = z->create_host(name, kFlops);
          if (static_cast<int>(id) < leaves) hosts[id] = h;
          return std::make_pair(h->get_netpoint(), static_cast<simgrid::kernel::routing::NetPoint*>(nullptr));
        }),
        p.link_Bps, p.link_latency_s, sg4::Link::SharingPolicy::SPLITDUPLEX);
  } else {
    // The same tree (fattree.hpp); the leaves past `leaves` have no host.
    auto* fabric =
        new FatTreeNetZone("fabric", tree);  // NOLINT(cppcoreguidelines-owning-memory): root owns it
    fabric->set_parent(root->get_impl());
    for (int i = 0; i < leaves; ++i) {
      std::string name = "h";  // (not "h" + to_string: GCC 12 warns on it, bug 105651)
      name += std::to_string(i);
      hosts[static_cast<std::size_t>(i)] = fabric->get_iface()->create_host(name, kFlops);
    }
    fabric->create_links(p.link_Bps, p.link_latency_s);
    zone = fabric->get_iface();
  }
  for (int i = 0; i < nodes; ++i) c->nodes.push_back(hosts[static_cast<std::size_t>(i)]);
  for (int s = 0; s < servers; ++s) {
    sg4::Host* h = hosts[static_cast<std::size_t>(nodes) + static_cast<std::size_t>(s)];
    c->pfs_servers.push_back(h);
    c->pfs_disks.push_back(h->create_disk("disk", p.pfs.disk_Bps, p.pfs.disk_Bps)->seal());
  }
  const auto past_servers = static_cast<std::size_t>(nodes) + static_cast<std::size_t>(servers);
  c->metadata = hosts[past_servers];
  c->metadata->set_core_count(std::max(1, p.pfs.metadata_threads));
  c->launcher = hosts[past_servers + 1];
  for (auto* h : hosts) h->seal();
  zone->seal();
  root->seal();
  return c;
}

std::vector<double>& Cluster::send_times(const std::string& tag, int slots) const {
  auto& v = send_times_[tag];
  if (v.empty()) v.assign(static_cast<std::size_t>(slots), 0.0);
  return v;
}

double Cluster::max_over_members(const std::string& tag, int n, double mine) const {
  Pooled& p = pooled_[tag];
  if (!p.barrier) p.barrier = sg4::Barrier::create(static_cast<unsigned>(n));
  p.max = std::max(p.max, mine);
  const sg4::BarrierPtr barrier = p.barrier;
  barrier->wait();
  return pooled_[tag].max;
}

double Cluster::message_s(int from, int to, double bytes) const {
  // The level of the lowest switch above both (a fat tree's routes up to it and down are alike).
  std::size_t level = leaves_under.size();
  if (from != to) {
    for (std::size_t l = 0; l < leaves_under.size(); ++l) {
      if (from / leaves_under[l] == to / leaves_under[l]) {
        level = l;
        break;
      }
    }
  }
  if (level < leaves_under.size() && level < route_by_level_.size() && route_by_level_[level].second > 0)
    return route_by_level_[level].first + bytes / route_by_level_[level].second;
  std::vector<sg4::Link*> links;
  double latency = 0;
  nodes[static_cast<std::size_t>(from)]->route_to(nodes[static_cast<std::size_t>(to)], links, &latency);
  double rate = std::numeric_limits<double>::infinity();
  for (const sg4::Link* l : links) rate = std::min(rate, l->get_bandwidth());
  // CM02 bounds a flow's rate by TCP's window over the round trip as well.
  static const double gamma = simgrid::config::get_value<double>("network/TCP-gamma");
  if (gamma > 0 && latency > 0) rate = std::min(rate, gamma / (2 * latency));
  if (level < leaves_under.size()) {
    if (route_by_level_.size() <= level) route_by_level_.resize(leaves_under.size(), {0.0, 0.0});
    route_by_level_[level] = {latency, rate};
  }
  return latency + bytes / rate;
}

void Cluster::computed_collective(
    const std::string& tag, int n, int me,
    const std::function<std::vector<double>(const std::vector<double>&)>& schedule) const {
  Computed& s = computed_[tag];  // std::map: the reference stays valid while others are added
  if (!s.barrier) {
    s.barrier = sg4::Barrier::create(static_cast<unsigned>(n));
    s.entered.assign(static_cast<std::size_t>(n), 0.0);
  }
  s.entered[static_cast<std::size_t>(me)] = sg4::Engine::get_clock();
  const sg4::BarrierPtr barrier = s.barrier;
  barrier->wait();
  if (s.leave.empty()) s.leave = schedule(s.entered);
  const double leave = s.leave[static_cast<std::size_t>(me)];
  if (++s.left == n) computed_.erase(tag);
  if (leave < sg4::Engine::get_clock() - 1e-9)
    throw std::logic_error("computed collective " + tag + ": a member would leave before the last entered");
  sg4::this_actor::sleep_until(leave);
}

bool computed_control(const Cluster& c) {
  return c.options.sample > 0 && !c.options.simulate_control && !c.platform->local;
}

void compute(const Cluster& /*c*/, double seconds) {
  if (seconds > 0) sg4::this_actor::execute(seconds * kFlops);
}

void software(double seconds) {
  if (seconds > 0) sg4::this_actor::sleep_for(seconds);
}

sg4::CommPtr send_async(const Cluster& c, const std::string& box, double bytes) {
  software(c.platform->overhead_s);
  return post_async(c, box, bytes);
}

sg4::CommPtr post_async(const Cluster& c, const std::string& box, double bytes) {
  if (c.platform->local) {
    // Through shared memory the sender's core copies the message: CPU time that competes with the
    // ranks' computation for the machine's cores (the loopback link carries only the latency).
    compute(c, bytes / c.platform->link_Bps);
    return sg4::Mailbox::by_name(box)->put_async(&payload, 1);
  }
  return sg4::Mailbox::by_name(box)->put_async(&payload, static_cast<uint64_t>(std::max(1.0, bytes)));
}

void recv(const std::string& box) { sg4::Mailbox::by_name(box)->get<int>(); }

void ring_allreduce(const Cluster& c, Group& g, double bytes) {
  const int n = g.size();
  if (n < 2) return;
  const std::string tag = g.next_tag();
  const double block = bytes / n;
  // Sinew's ring sends a block in 256 KiB segments, so the sum of one overlaps the transfer of the next:
  // what is not hidden is the sum of one segment.
  const double exposed_sum = std::min(block, 256.0 * 1024) / c.calibration->costs.reduce_Bps;
  const int steps = n - 1;
  // Sampled: the first k_sim steps of each phase are simulated. Every step moves the same bytes over the
  // same links, and a member cannot run ahead of the one before it, so the ring settles at the pace of
  // its slowest hop. A hop's time is measured where the block arrives, from the moment both its ends
  // had begun the step (the send's overhead, the transfer, the receiver's exposed sum), which leaves
  // out what a member waited for its predecessor: the members enter the ring at different times after a
  // recovery, and a wait that happens once must not be multiplied by thousands of steps. The pace of the
  // steps not simulated is the slowest hop's shortest time over the sample after its first step. It
  // matches the full simulation from 4 steps on (sim.py check); the members' mean pace from the first
  // step, which the model used before, undershot it.
  const int k_sim = c.options.sample > 0 ? std::min(steps, ring_sample_steps(c.options.sample)) : steps;
  const int next = (g.me + 1) % n;
  const bool sampled = k_sim < steps;
  std::vector<double>* started = sampled ? &c.send_times(tag, 2 * n * k_sim) : nullptr;
  const auto slot = [n, k_sim](int phase, int member, int s) {
    return (static_cast<std::size_t>(phase) * n + member) * k_sim + s;
  };
  const int prev = (g.me - 1 + n) % n;
  for (int phase = 0; phase < 2; ++phase) {  // reduce-scatter, then allgather
    double shortest = std::numeric_limits<double>::infinity();
    for (int s = 0; s < k_sim; ++s) {
      const double begun = sg4::Engine::get_clock();
      if (sampled) (*started)[slot(phase, g.me, s)] = begun;
      auto out = send_async(c, mailbox(tag, next, phase), block);
      recv(mailbox(tag, g.me, phase));
      if (phase == 0) compute(c, exposed_sum);
      if (sampled && s > 0) {  // from when both ends of the hop had begun the step
        const double hop = sg4::Engine::get_clock() - std::max(begun, (*started)[slot(phase, prev, s)]);
        shortest = std::min(shortest, hop);
      }
      out->wait();
    }
    if (sampled) {
      const double pace = c.max_over_members(tag + ":" + std::to_string(phase), n, shortest);
      sg4::this_actor::sleep_for(pace * (steps - k_sim));
    }
  }
}

namespace {

// The binary trees of the collectives, with the group's `root` member at the root. `up`: reduce towards
// the root; `down`: broadcast from it (segmented: up and down run in two actors per member, so that
// segment s goes down while s+1 still goes up). Two shapes:
// - in order (the tree allreduce and the state broadcast; NCCL builds its trees across nodes so): the
//   members of a range hang under the range's middle one, the halves on either side under it, and so
//   on down. Neighbouring members are linked at the bottom, where half of the tree's edges are, so most
//   of its messages stay under one switch, as they do in the large-message broadcasts MPI libraries
//   choose (pipelined chains, scatter + ring allgather).
// - level by level (ERA's agreement): member v's children are 2v+1 and 2v+2 counted from the root, so
//   most of its (small) messages cross the fabric's core.
class Tree {
 public:
  enum class Shape : std::uint8_t { kInOrder, kLevelOrder };
  Tree(Shape shape, int n, int me, int root) : n_(n) {
    if (shape == Shape::kLevelOrder) {
      shift_ = root;
      const int v = (me - root + n) % n;
      for (int ch = 2 * v + 1; ch <= 2 * v + 2 && ch < n; ++ch) children_.push_back(member(ch));
      if (v != 0) parent_ = member((v - 1) / 2);
      return;
    }
    shift_ = (root - n / 2 + n) % n;
    const int v = (me - shift_ + n) % n;
    int lo = 0, hi = n;
    for (;;) {  // down from the whole range to the one v is the middle of
      const int mid = lo + (hi - lo) / 2;
      if (mid == v) {
        if (lo < mid) children_.push_back(member(lo + (mid - lo) / 2));
        if (mid + 1 < hi) children_.push_back(member(mid + 1 + (hi - mid - 1) / 2));
        return;
      }
      parent_ = member(mid);
      if (v < mid) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
  }
  [[nodiscard]] bool is_root() const { return parent_ < 0; }
  [[nodiscard]] int parent() const { return parent_; }                          ///< a member; -1 at the root
  [[nodiscard]] const std::vector<int>& children() const { return children_; }  ///< members

 private:
  [[nodiscard]] int member(int label) const { return (label + shift_) % n_; }
  int n_, shift_ = 0, parent_ = -1;
  std::vector<int> children_;
};

int segments_for(const Cluster& c, double bytes) {
  return std::max(1, std::min(c.options.tree_segments, static_cast<int>(std::ceil(bytes / (64.0 * 1024)))));
}

void tree_down(const Cluster& c, const Tree& t, int me, const std::string& tag, double seg, int segs,
               const sg4::SemaphorePtr& ready) {
  std::vector<sg4::CommPtr> out;
  for (int s = 0; s < segs; ++s) {
    if (t.is_root()) {
      if (ready) ready->acquire();
    } else {
      recv(mailbox(tag + "d", me));
    }
    wait_all(out);
    for (int ch : t.children()) out.push_back(send_async(c, mailbox(tag + "d", ch), seg));
  }
  wait_all(out);
}

}  // namespace

void tree_allreduce(const Cluster& c, Group& g, double bytes) {
  const int n = g.size();
  if (n < 2) return;
  const std::string tag = g.next_tag();
  const int me = g.me;
  const Tree t(Tree::Shape::kInOrder, n, me, n / 2);  // the root in the middle: labels are members
  const int segs = segments_for(c, bytes);
  const double seg = bytes / segs;
  auto ready = sg4::Semaphore::create(0);
  auto down = sg4::Actor::create("down", sg4::this_actor::get_host(), [&c, t, me, tag, seg, segs, ready] {
    tree_down(c, t, me, tag, seg, segs, ready);
  });
  sg4::CommPtr out;
  for (int s = 0; s < segs; ++s) {
    for (int ch : t.children()) {
      recv(mailbox(tag + "u", me, ch));
      compute(c, seg / c.calibration->costs.reduce_Bps);
    }
    if (t.is_root()) {
      ready->release();
    } else {
      if (out) out->wait();
      out = send_async(c, mailbox(tag + "u", t.parent(), me), seg);
    }
  }
  if (out) out->wait();
  down->join();
}

void tree_broadcast(const Cluster& c, Group& g, int root, double bytes) {
  const int n = g.size();
  if (n < 2) return;
  const std::string tag = g.next_tag();
  const Tree t(Tree::Shape::kInOrder, n, g.me, root);
  const int segs = segments_for(c, bytes);
  tree_down(c, t, g.me, tag, bytes / segs, segs, nullptr);
}

void bytegrad_allreduce(const Cluster& c, Group& g, double bytes) {
  const int n = g.size();
  if (n < 2) return;
  const Costs& k = c.calibration->costs;
  constexpr double kChunk = 2048;  // elements per quantisation chunk; 8 bytes of grid per chunk
  const double wire = bytes / 4 * (1 + 8 / kChunk);
  compute(c, bytes / k.encode_Bps);
  all_to_all(c, g, wire / n);
  compute(c, (n - 1) * (bytes / n) / k.decode_Bps + (bytes / n) / k.encode_Bps);
  all_to_all(c, g, wire / n);
  compute(c, bytes / k.decode_Bps);
}

namespace {

constexpr double kAgreeBytes = 64;

// ERA's tree numbered level by level from the root, member 0: member v's children are 2v+1 and 2v+2.
// Computed, message by message, as agreement() below runs it in the simulation: a transfer starts when
// both its send and its receive are posted (SimGrid's rendezvous) and takes message_s(); the sender
// pays the platform's overhead before each send, a member its hop cost after its children's messages
// and after its parent's.
std::vector<double> agreement_schedule(const Cluster& c, const Members& m, const std::vector<double>& entered,
                                       double hop) {
  const int n = static_cast<int>(entered.size());
  const double o = std::max(0.0, c.platform->overhead_s);
  hop = std::max(0.0, hop);
  auto x = [&](int a, int b) {
    return c.message_s((*m)[static_cast<std::size_t>(a)], (*m)[static_cast<std::size_t>(b)], kAgreeBytes);
  };
  auto sz = [](int v) { return static_cast<std::size_t>(v); };
  // Up: children before parents (their numbers are larger).
  std::vector<double> posted_up(sz(n)), up_done(sz(n)), after_up(sz(n));
  for (int v = n - 1; v >= 0; --v) {
    double t = entered[sz(v)];
    for (int ch = 2 * v + 1; ch <= 2 * v + 2 && ch < n; ++ch) {  // received one after the other
      t = std::max(t, posted_up[sz(ch)]) + x(ch, v);
      up_done[sz(ch)] = t;  // the child's send completes with the receive
    }
    after_up[sz(v)] = t + hop;
    posted_up[sz(v)] = after_up[sz(v)] + o;
  }
  // Down: parents before children. A member posts its receive from the parent once its own send up is
  // done; it sends to its children one overhead after the other and leaves when all have arrived.
  std::vector<double> posted_down(sz(n)), leave(sz(n));
  for (int v = 0; v < n; ++v) {
    double t = after_up[sz(v)];
    if (v != 0) t = std::max(up_done[sz(v)], posted_down[sz(v)]) + x((v - 1) / 2, v) + hop;
    double end = t, post = t;
    for (int ch = 2 * v + 1; ch <= 2 * v + 2 && ch < n; ++ch) {
      post += o;
      posted_down[sz(ch)] = post;
      end = std::max(end, std::max(post, up_done[sz(ch)]) + x(v, ch));
    }
    leave[sz(v)] = end;
  }
  return leave;
}

// small_allgather()'s rounds, computed: in round r each member posts its send to me - d and its
// receive from me + d one overhead after it began the round, and begins the next when both are done.
std::vector<double> allgather_schedule(const Cluster& c, const Members& m, const std::vector<double>& entered,
                                       double item) {
  const int n = static_cast<int>(entered.size());
  const double o = std::max(0.0, c.platform->overhead_s);
  std::vector<double> t = entered, posted(entered.size()), arrived(entered.size());
  for (int d = 1; d < n; d *= 2) {
    const double bytes = item * std::min(d, n - d);
    for (std::size_t v = 0; v < t.size(); ++v) posted[v] = t[v] + o;
    for (int v = 0; v < n; ++v) {
      const int from = (v + d) % n;
      arrived[static_cast<std::size_t>(v)] =
          std::max(posted[static_cast<std::size_t>(from)], posted[static_cast<std::size_t>(v)]) +
          c.message_s((*m)[static_cast<std::size_t>(from)], (*m)[static_cast<std::size_t>(v)], bytes);
    }
    for (int v = 0; v < n; ++v) {  // done when its own receive and its send (the receive of v - d) are
      t[static_cast<std::size_t>(v)] =
          std::max(arrived[static_cast<std::size_t>(v)], arrived[static_cast<std::size_t>((v - d + n) % n)]);
    }
  }
  return t;
}

}  // namespace

void agreement(const Cluster& c, Group& g, double hop) {
  const std::string tag = g.next_tag();
  if (computed_control(c)) {
    const Members m = g.members;
    c.computed_collective(tag, g.size(), g.me, [&c, m, hop](const std::vector<double>& entered) {
      return agreement_schedule(c, m, entered, hop);
    });
    return;
  }
  const Tree t(Tree::Shape::kLevelOrder, g.size(), g.me, 0);  // ERA's tree, numbered level by level
  for (int ch : t.children()) recv(mailbox(tag + "u", g.me, ch));
  software(hop);
  if (!t.is_root()) {
    send_async(c, mailbox(tag + "u", t.parent(), g.me), kAgreeBytes)->wait();
    recv(mailbox(tag + "d", g.me));
    software(hop);
  }
  std::vector<sg4::CommPtr> out;
  for (int ch : t.children()) out.push_back(send_async(c, mailbox(tag + "d", ch), kAgreeBytes));
  wait_all(out);
}

void small_allgather(const Cluster& c, Group& g, double item) {
  const int n = g.size();
  const std::string tag = g.next_tag();
  if (computed_control(c)) {
    const Members m = g.members;
    c.computed_collective(tag, n, g.me, [&c, m, item](const std::vector<double>& entered) {
      return allgather_schedule(c, m, entered, item);
    });
    return;
  }
  for (int d = 1, r = 0; d < n; d *= 2, ++r) {
    auto out = send_async(c, mailbox(tag, (g.me - d + n) % n, r), item * std::min(d, n - d));
    recv(mailbox(tag, g.me, r));
    out->wait();
  }
}

void binomial_broadcast(const Cluster& c, Group& g, int root, double hop_s) {
  const int n = g.size();
  const std::string tag = g.next_tag();
  const int v = (g.me - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) break;
    mask <<= 1;
  }
  if (v != 0) {
    recv(mailbox(tag, g.me));
    software(hop_s);
  }
  std::vector<sg4::CommPtr> out;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) out.push_back(send_async(c, mailbox(tag, (v + mask + root) % n), 64));
  }
  wait_all(out);
}

namespace {

// libnbc's MPI_Ibcast (ompi/mca/coll/libnbc/nbc_ibcast.c, Open MPI 4 and 5): its choice of shape, and
// its virtual ranks (the root is 0, rank 0 takes the root's number, the others keep theirs).
struct BcastShape {
  enum class Kind : std::uint8_t { kLinear, kBinomial, kChain } kind = Kind::kLinear;
  int frags = 1;
  double frag = 0;
};

BcastShape bcast_shape(int n, double bytes) {
  if (n <= 4) return {BcastShape::Kind::kLinear, 1, bytes};
  if (bytes < 65536) return {BcastShape::Kind::kBinomial, 1, bytes};
  const double frag = bytes < 524288 ? 8192 : 32768;
  const int frags = std::max(1, static_cast<int>(std::ceil(bytes / frag)));
  return {BcastShape::Kind::kChain, frags, bytes / frags};
}

int vrank_to_rank(int v, int root) { return v == 0 ? root : v == root ? 0 : v; }

// A binomial tree's children of virtual rank v, nearest first (libnbc: v sends to v + 2^r while v < 2^r).
template <class F>
void binomial_children(int v, int n, F&& each) {
  for (long d = std::bit_ceil(static_cast<unsigned>(v) + 1); v + d < n; d *= 2) each(static_cast<int>(v + d));
}

void simulated_broadcast(const Cluster& c, Group& g, int root, double bytes) {
  const int n = g.size();
  const std::string tag = g.next_tag();
  if (n < 2) return;
  const BcastShape shape = bcast_shape(n, bytes);
  const int me = g.me;
  std::vector<sg4::CommPtr> out;
  if (shape.kind == BcastShape::Kind::kLinear) {
    if (me == root) {
      for (int q = 0; q < n; ++q) {
        if (q != root) out.push_back(send_async(c, mailbox(tag, q), bytes));
      }
      wait_all(out);
    } else {
      recv(mailbox(tag, me));
    }
    return;
  }
  const int v = me == root ? 0 : me == 0 ? root : me;
  if (shape.kind == BcastShape::Kind::kBinomial) {
    if (v != 0) recv(mailbox(tag, me));
    binomial_children(
        v, n, [&](int ch) { out.push_back(send_async(c, mailbox(tag, vrank_to_rank(ch, root)), bytes)); });
    wait_all(out);
    return;
  }
  const int next = v + 1 < n ? vrank_to_rank(v + 1, root) : -1;
  for (int f = 0; f < shape.frags; ++f) {
    if (v == 0) {
      send_async(c, mailbox(tag, next, f), shape.frag)->wait();
      continue;
    }
    auto in = sg4::Mailbox::by_name(mailbox(tag, me, f))->get_async<int>(&received);
    if (f > 0 && next >= 0) out.push_back(send_async(c, mailbox(tag, next, f - 1), shape.frag));
    in->wait();
    wait_all(out);
  }
  if (v != 0 && next >= 0) send_async(c, mailbox(tag, next, shape.frags - 1), shape.frag)->wait();
}

}  // namespace

void sequential_broadcasts(const Cluster& c, Group& g, const std::vector<int>& roots,
                           const std::vector<double>& bytes) {
  const int n = g.size(), count = static_cast<int>(roots.size());
  if (n < 2) return;
  // Sampled: the first k = 8 * sample (64) broadcasts are simulated, the others go at the pace of the
  // second half of those (the slowest member's): every broadcast sends shards of (nearly) the same size
  // down the same shape of tree or chain from the next root, and a member enters one when it is done with
  // the one before. The pace still grows over the first few dozen broadcasts (their overlap builds up, and
  // the roots move from one switch to the next): at 256 ranks on HDR the first 8 gave a gather 18 % short
  // of the full simulation, 32 gave 12 %, 64 0.5 %. sim.py check compares sampled and full. (Computed from
  // the routes, as the agreements are, the gather came out 34-41 % short at 64 ranks: a binomial root's
  // sends of tens of KiB share its NIC, which a schedule of idle routes does not see.)
  const int k = c.options.sample > 0 ? std::min(count, 8 * c.options.sample) : count;
  double half = 0;
  for (int i = 0; i < k; ++i) {
    if (i == k / 2) half = sg4::Engine::get_clock();
    if (bytes[static_cast<std::size_t>(i)] > 0)
      simulated_broadcast(c, g, roots[static_cast<std::size_t>(i)], bytes[static_cast<std::size_t>(i)]);
  }
  if (k < count) {
    const std::string tag = g.next_tag();
    const double pace = c.max_over_members(tag, n, (sg4::Engine::get_clock() - half) / (k - k / 2));
    sg4::this_actor::sleep_for(pace * (count - k));
  }
}

void allgather_linear(const Cluster& c, Group& g, double bytes) { all_to_all(c, g, bytes); }

void allgatherv_linear(const Cluster& c, Group& g, const std::function<double(int)>& block, double largest) {
  const int n = g.size();
  if (n < 2) return;
  const std::string tag = g.next_tag();
  const int shifts = n - 1, me = g.me;
  if (c.options.sample == 0 || 8 * c.options.sample >= shifts || c.platform->local) {
    // Round r: the block of member me - r arrives, this member's goes to me + r.
    const double mine = block(me);
    std::vector<sg4::CommPtr> comms;
    for (int r = 1; r < n; ++r)
      comms.push_back(sg4::Mailbox::by_name(mailbox(tag, me, r))->get_async<int>(&received));
    for (int r = 1; r < n; ++r) comms.push_back(send_async(c, mailbox(tag, (me + r) % n, r), mine));
    wait_all(comms);
    return;
  }
  // Computed. (Two sampled simulations were tried first: the owners' messages in groups as all_to_all()
  // sends them, or in one flow per owner, met on the fat tree's uplinks, which route by destination, and
  // came out up to 2.6x slow; one flow per member took 5 min at 16 384 ranks.)
  const double o = c.platform->overhead_s;
  const double dt = std::max(shifts * o, o + shifts * largest / c.platform->link_Bps) + c.longest_path_s;
  c.computed_collective(tag, n, me, [dt, n](const std::vector<double>& entered) {
    return std::vector<double>(static_cast<std::size_t>(n),
                               *std::max_element(entered.begin(), entered.end()) + dt);
  });
}

void reduce_scatter_libnbc(const Cluster& c, Group& g, double bytes, const std::function<double(int)>& part) {
  const int n = g.size();
  if (n < 2) return;
  const std::string tag = g.next_tag();
  const int me = g.me;
  // The reduce: in round d (1, 2, 4, ...) a member that is a multiple of 2d receives from member + d and
  // sums; the others send what they have to member - d and are done with it.
  for (int d = 1; d < n; d *= 2) {
    if (me % (2 * d) == 0) {
      if (me + d < n) {
        recv(mailbox(tag + "r", me, me + d));
        compute(c, bytes / c.calibration->costs.reduce_Bps);
      }
    } else {
      send_async(c, mailbox(tag + "r", me - d, me), bytes)->wait();
      break;
    }
  }
  const bool sampled = c.options.sample > 0 && c.options.sample < n - 1;
  if (!sampled) {
    if (me == 0) {
      std::vector<sg4::CommPtr> out;
      for (int q = 1; q < n; ++q) out.push_back(send_async(c, mailbox(tag + "s", q), part(q)));
      wait_all(out);
    } else {
      recv(mailbox(tag + "s", me));
    }
    return;
  }
  // Member 0 is the last to finish the reduce (it sums what every other member sent): from here on its
  // sends are the schedule of every member's part.
  c.max_over_members(tag, n, 0);
  const double t0 = sg4::Engine::get_clock(), o = c.platform->overhead_s;
  if (me == 0) {
    std::vector<sg4::CommPtr> out;
    int paid = 0;  // overheads paid so far: member 0 posts the part of member q after q of them
    for (int q = 1; q < n; ++q) {
      const double b = part(q);
      if (b <= 0) continue;
      software((q - paid) * o);
      paid = q;
      out.push_back(post_async(c, mailbox(tag + "s", q), b));
    }
    software((n - 1 - paid) * o);
    wait_all(out);
  } else if (part(me) > 0) {
    recv(mailbox(tag + "s", me));
  } else {
    const auto& m = *g.members;
    sg4::this_actor::sleep_until(t0 + me * o + c.message_s(m[0], m[static_cast<std::size_t>(me)], 1));
  }
}

void exchange(const Cluster& c, Group& g, const std::vector<Transfer>& sends,
              const std::vector<Transfer>& recvs) {
  const std::string tag = g.next_tag();
  std::vector<sg4::CommPtr> comms;
  comms.reserve(sends.size() + recvs.size());
  for (const Transfer& r : recvs)
    comms.push_back(sg4::Mailbox::by_name(mailbox(tag, g.me, r.peer))->get_async<int>(&received));
  for (const Transfer& s : sends) {
    software(s.messages * c.platform->overhead_s);
    comms.push_back(post_async(c, mailbox(tag, s.peer, g.me), s.bytes));
  }
  wait_all(comms);
}

namespace {

int subtree_size(int v, int vertices, int f) {
  int size = 1;
  for (int ch = f * v + 1; ch <= f * v + f && ch < vertices; ++ch) size += subtree_size(ch, vertices, f);
  return size;
}

}  // namespace

void daemon_broadcast(const Cluster& c, const std::string& tag, int vertex, int vertices, double bytes) {
  const int f = c.platform->runtime.fanout;
  if (vertex != 0) recv(mailbox(tag, vertex));
  software(c.platform->runtime.hop_s);
  // One child after the other, as a daemon's out-of-band channel sends them: the last child has its
  // message when it would have with all sent at once (the sender's link is the bottleneck either way),
  // and the simulation has a flow per daemon in flight instead of one per child.
  for (int ch = f * vertex + 1; ch <= f * vertex + f && ch < vertices; ++ch) {
    send_async(c, mailbox(tag, ch), bytes)->wait();
  }
}

void daemon_gather(const Cluster& c, const std::string& tag, int vertex, int vertices,
                   double bytes_per_node) {
  const int f = c.platform->runtime.fanout;
  for (int ch = f * vertex + 1; ch <= f * vertex + f && ch < vertices; ++ch) recv(mailbox(tag, vertex));
  software(c.platform->runtime.hop_s);
  if (vertex != 0) {
    send_async(c, mailbox(tag, (vertex - 1) / f), bytes_per_node * subtree_size(vertex, vertices, f))->wait();
  }
}

void pfs_read(const Cluster& c, int node, int file, double bytes, int reader, int readers) {
  const Platform& p = *c.platform;
  if (p.local) return;  // the calibration's page cache: in the measured constants
  sg4::Host* me = c.nodes[static_cast<std::size_t>(node)];
  // The open: the metadata server serves `metadata_threads` opens at a time, in the readers' order, so
  // the reader-th waits for its turn. Only the round trip of a group's first reader (below) crosses
  // the fabric: `readers` small flows into one link would cost the simulation their square in time
  // and change the result by a few microseconds.
  const auto threads = std::max(1, p.pfs.metadata_threads);
  const int turn = reader / threads + 1;  // whole rounds of `threads` opens
  software(turn * p.pfs.metadata_op_s);
  // Readers are spread evenly over the servers. While there are fewer readers than servers, a reader
  // takes its stripes from as many servers as are left to it (all `stripes` for a lone reader). Once
  // readers outnumber the servers, the readers of one server share it fairly and finish
  // together, so the group's first reader moves the whole group's bytes in one flow and the others
  // wait for it: every server carries the same bytes as with one flow per reader and stripe, but
  // the simulation has `servers` flows instead of readers x stripes (16 384 ranks on 64 stripes
  // would be a million flows, and SimGrid's sharing solver grows with their square). This needs a
  // node's link to be at least as fast as a server (the group's flow ends at its first reader's
  // node); load_platform() checks it.
  const int servers = static_cast<int>(c.pfs_servers.size());
  const int stripes = std::clamp(servers / std::max(1, readers), 1, std::min(p.pfs.stripes, servers));
  // Groups are strided (reader r in group r mod groups), so that their first readers are neighbours:
  // the fat tree routes by destination, and first readers a whole switch apart would all take the
  // same uplink.
  const int groups = ceil_div(readers, std::max(1, ceil_div(readers, servers)));
  const int first = reader % groups, members = ceil_div(readers - first, groups);
  const std::string tag = "pfs" + std::to_string(file) + ":" + std::to_string(first);
  if (reader != first) {
    c.max_over_members(tag, members, 0);  // until the group's data has arrived
    return;
  }
  sg4::Comm::sendto(me, c.metadata, 256);
  sg4::Comm::sendto(c.metadata, me, 256);
  const double piece = bytes * members / stripes;
  std::vector<sg4::IoPtr> ios;
  std::vector<int> which;
  for (int j = 0; j < stripes; ++j) {
    const int s = static_cast<int>((file * 7L + static_cast<long>(first) * stripes + j) % servers);
    which.push_back(s);
    ios.push_back(c.pfs_disks[static_cast<std::size_t>(s)]->read_async(static_cast<sg_size_t>(piece)));
  }
  for (auto& io : ios) io->wait();
  std::vector<sg4::CommPtr> comms;
  comms.reserve(which.size());
  for (int s : which) {
    comms.push_back(sg4::Comm::sendto_async(c.pfs_servers[static_cast<std::size_t>(s)], me,
                                            static_cast<uint64_t>(piece)));
  }
  wait_all(comms);
  if (members > 1) c.max_over_members(tag, members, 0);
}

}  // namespace sinew::sim
