// The two scenarios: one training step of an algorithm at n ranks, and the recovery from one failure
// (a process killed, or a node lost) in each of Sinew's four modes.
#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <numeric>
#include <stdexcept>

#include "cluster.hpp"
#include "sinew/train/shards.hpp"

namespace sinew::sim {

namespace {

constexpr double kChunk = 2048;  // quantisation chunk (elements); 8 bytes of grid per chunk

double wire_bytes(double params) { return params * (1 + 8 / kChunk); }

std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

/// Where `node` is among a group's members, which are in ascending order.
int index_of(const std::vector<int>& ascending, int node) {
  const auto it = std::lower_bound(ascending.begin(), ascending.end(), node);
  if (it == ascending.end() || *it != node)
    throw std::logic_error("node " + std::to_string(node) + " not in the group");
  return static_cast<int>(it - ascending.begin());
}

void configure(sg4::Engine& e, const Platform& p, int ranks) {
  // The flow model without TCP's corrections (LV08's are fitted to wide-area TCP): latency and
  // bandwidth as the platform states them; no reverse traffic for acknowledgements.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  // Small actor stacks: SimGrid clears every stack it allocates, and there are several actors per rank.
  // The deepest of them needs between 4 and 6 KiB (every scenario at 64 ranks runs in 6 KiB with guard
  // pages, and fails in 4), so 16 KiB leaves room. Up to 1 024 ranks a guard page below each stack
  // turns an overflow into a reported error (the check's simulations are all there); beyond, 16 384
  // ranks and their helper actors would pass Linux's limit of memory mappings per process.
  sg4::Engine::set_config("contexts/stack-size:16");
  sg4::Engine::set_config(ranks <= 1024 ? "contexts/guard-size:4096" : "contexts/guard-size:0");
  if (p.local) {
    sg4::Engine::set_config("network/loopback-lat:" + std::to_string(p.link_latency_s));
    sg4::Engine::set_config("network/loopback-bw:1e15");  // the copy is the sender's CPU time
  }
  (void)e;
}

void allreduce(const Cluster& c, Group& g, double bytes, Algorithm a) {
  if (a == Algorithm::kRing) ring_allreduce(c, g, bytes);
  if (a == Algorithm::kTree) tree_allreduce(c, g, bytes);
  if (a == Algorithm::kByteGrad) bytegrad_allreduce(c, g, bytes);
}

/// The flat buffer's shards over a group of n (train::ShardLayout's: shard s is [total*s/n, total*(s+1)/n)),
/// and the bytes of float32 a shard has in a range of elements. Arithmetic only: called for every member of
/// every chunk's scatter.
struct Flat {
  std::size_t total;
  int n, replicas;
  Flat(const Workload& w, int members)
      : total(static_cast<std::size_t>(w.params)),
        n(members),
        replicas(std::clamp(w.shard_replicas, 1, members)) {}
  [[nodiscard]] std::size_t begin(int s) const {
    return total * static_cast<std::size_t>(s) / static_cast<std::size_t>(n);
  }
  [[nodiscard]] double bytes_in(int s, std::size_t lo, std::size_t hi) const {
    const std::size_t a = std::max(lo, begin(s)), b = std::min(hi, begin(s + 1));
    return b > a ? 4.0 * static_cast<double>(b - a) : 0.0;
  }
  [[nodiscard]] int stride() const { return std::max(1, n / replicas); }
  /// The shard element e (< total) is in.
  [[nodiscard]] int shard_of(std::size_t e) const {
    auto s = static_cast<int>(e * static_cast<std::size_t>(n) / total);
    while (s + 1 < n && begin(s + 1) <= e) ++s;
    while (s > 0 && begin(s) > e) --s;
    return s;
  }
};

/// Sinew's scatter_bucket (--shard gradients and parameters) for the bucket of elements [lo, hi): MPI's
/// reduce-scatter of each chunk of at most 1 Mi elements over the shards' owners (libnbc's), then each
/// owner's reduced part of the bucket point to point to its shard's R-1 other holders.
void scatter_bucket(const Cluster& c, Group& g, const Flat& f, std::size_t lo, std::size_t hi) {
  constexpr std::size_t kScatterChunk = std::size_t{1} << 20;  // as train/shards.cpp's
  for (std::size_t at = lo; at < hi; at += kScatterChunk) {
    const std::size_t end = std::min(hi, at + kScatterChunk);
    reduce_scatter_libnbc(c, g, 4.0 * static_cast<double>(end - at),
                          [&f, at, end](int q) { return f.bytes_in(q, at, end); });
  }
  std::vector<Transfer> sends, recvs;
  const double own = f.bytes_in(g.me, lo, hi);
  for (int k = 1; k < f.replicas; ++k) {
    if (own > 0) sends.push_back({(g.me + k * f.stride()) % f.n, 1, own});
    const int s = ((g.me - k * f.stride()) % f.n + f.n) % f.n;  // a shard this member holds
    const double part = f.bytes_in(s, lo, hi);
    if (part > 0) recvs.push_back({s, 1, part});
  }
  // By every member, with something to move or not, so that the group's tags stay in step.
  exchange(c, g, sends, recvs);
}

/// A ZeRO-3 unit's gather (ShardedOptimizer::gather_ranges): one MPI_Iallgatherv of its range of elements
/// [lo, hi) from the owners of the shards it crosses.
void gather_unit(const Cluster& c, Group& g, const Flat& f, std::size_t lo, std::size_t hi) {
  // The largest block: the first owner's, the last's, or a whole shard between them.
  const int first = f.shard_of(lo), last = f.shard_of(hi - 1);
  double largest = std::max(f.bytes_in(first, lo, hi), f.bytes_in(last, lo, hi));
  if (last - first > 1) largest = std::max(largest, f.bytes_in(first + 1, lo, hi));
  allgatherv_linear(
      c, g, [&f, lo, hi](int q) { return f.bytes_in(q, lo, hi); }, largest);
}

/// One rank's step with --shard parameters (ZeRO-3, python/sinew/units.py). Every gather is a task of the
/// communication actor, which runs its tasks in the order they are handed over (Bucketer::post_in_order):
/// forward waits for each unit's gather before its forward, and as a unit starts hands over the gathers of
/// the next `w.prefetch` units (0: each gather is handed over when its unit is reached, nothing overlaps
/// computation); backward, when the gradient of a unit's output arrives, waits for the unit's gather and
/// hands over those of the `w.prefetch` units before it. The buckets are reduce-scattered as they complete
/// (gradients become final from the end of the flat buffer on, at backward's pace), behind the gathers
/// handed over before them; then the update of the R shards held. No gather after it. (A steady step: the
/// forward's prediction is the last forward's, which in a loop of alike steps always holds.) Returns the
/// communication not hidden behind computation; `gather_s`: of it the waits for the units' gathers;
/// `scatter_s`: the communication actor's time in the buckets' reduce-scatters (overlapped or not).
double zero3_step(const Cluster& c, Group& g, const Workload& w, double* gather_s, double* scatter_s) {
  const double fwd = w.compute_s * (1 - w.backward_frac - w.optimizer_frac);
  const double bwd = w.compute_s * w.backward_frac;
  const double opt = w.compute_s * w.optimizer_frac;
  const int n = g.size(), units = std::max(1, w.units);
  const Flat f(w, n);
  const std::size_t total = f.total;
  auto unit_lo = [&](int u) { return total * static_cast<std::size_t>(u) / static_cast<std::size_t>(units); };
  struct Queue {
    std::deque<std::function<void()>> tasks;
    sg4::SemaphorePtr ready = sg4::Semaphore::create(0);
    double scattering = 0;
  } q;
  auto comm = sg4::Actor::create("comm", sg4::this_actor::get_host(), [&q] {
    for (;;) {
      q.ready->acquire();
      std::function<void()> task = std::move(q.tasks.front());
      q.tasks.pop_front();
      if (!task) return;
      task();
    }
  });
  auto hand_over = [&q](std::function<void()> task) {
    q.tasks.push_back(std::move(task));
    q.ready->release();
  };
  std::map<int, sg4::SemaphorePtr> posted;  // unit -> its gather's completion, handed over, not waited for
  auto post = [&](int u) {
    if (u < 0 || u >= units || posted.count(u) != 0) return;
    auto done = sg4::Semaphore::create(0);
    hand_over([&c, &g, &f, done, lo = unit_lo(u), hi = unit_lo(u + 1)] {
      gather_unit(c, g, f, lo, hi);
      done->release();
    });
    posted[u] = done;
  };
  double waited = 0;
  auto gather = [&](int u, int ahead) {  // the unit's hook: its gather waited for, the next ones handed over
    post(u);
    const double t = sg4::Engine::get_clock();
    posted[u]->acquire();
    posted.erase(u);
    waited += sg4::Engine::get_clock() - t;
    for (int k = 1; k <= w.prefetch; ++k) post(u + k * ahead);
  };
  for (int u = 0; u < units; ++u) {
    gather(u, +1);
    compute(c, fwd / units);
  }
  // Backward: gradients done from the end of the buffer: bucket b is final once backward has produced
  // (b+1)/buckets of them; unit u's backward starts at (units-1-u)/units. A bucket final at a unit's
  // boundary is handed over before that unit's hook runs.
  const double grad_bytes = 4 * w.params;
  const int buckets = std::max(1, static_cast<int>(std::ceil(grad_bytes / w.bucket_bytes)));
  gather(units - 1, -1);
  double done_frac = 0;
  int b = 0, next_unit = units - 2;
  while (b < buckets || next_unit >= 0) {
    const double bucket_at = b < buckets ? static_cast<double>(b + 1) / buckets : 2.0;
    const double unit_at = next_unit >= 0 ? static_cast<double>(units - 1 - next_unit) / units : 2.0;
    const double at = std::min(bucket_at, unit_at);
    compute(c, bwd * (at - done_frac));
    done_frac = at;
    if (bucket_at <= unit_at) {
      const std::size_t hi = total - total * static_cast<std::size_t>(b) / static_cast<std::size_t>(buckets);
      const std::size_t lo =
          total - total * static_cast<std::size_t>(b + 1) / static_cast<std::size_t>(buckets);
      hand_over([&c, &g, &f, &q, lo, hi] {
        const double t = sg4::Engine::get_clock();
        scatter_bucket(c, g, f, lo, hi);
        q.scattering += sg4::Engine::get_clock() - t;
      });
      ++b;
    } else {
      gather(next_unit--, -1);
    }
  }
  const double t = sg4::Engine::get_clock();
  hand_over(nullptr);
  comm->join();
  const double tail = sg4::Engine::get_clock() - t;
  compute(c, opt * std::min(w.shard_replicas, n) / n + w.overhead_s_per_param * w.params);
  if (gather_s != nullptr) *gather_s = waited;
  if (scatter_s != nullptr) *scatter_s = q.scattering;
  return waited + tail;
}

/// Owners and bytes of one broadcast each (a reshard's parameters).
struct Broadcasts {
  std::vector<int> roots;
  std::vector<double> bytes;
};

/// One rank's step: forward, backward with its buckets handed to a communication actor as they become
/// final (the exact and ByteGrad allreduces overlap backward), the exchange of the model for the
/// decentralized ones, and the optimiser. Sharded (--shard optimizer): the update of the R shards this
/// member holds (R/n of the optimiser's work), then the parameters' gather, one all-gather-v of the
/// owners' shards (ShardedOptimizer::gather, MPI_Iallgatherv; Sinew does it before the next forward pass,
/// the same place in a loop of steps). --shard gradients: each bucket reduce-scattered to its holders
/// instead of allreduced (scatter_bucket; the communication actor's time in them in `scatter_s`), the rest
/// as --shard optimizer. --shard parameters: zero3_step(). Returns the communication not hidden behind
/// computation (the gather's also in `gather_s`).
double train_step(const Cluster& c, Group& g, const Workload& w, Algorithm a, double* gather_s = nullptr,
                  double* scatter_s = nullptr) {
  if (w.parameters_sharded()) return zero3_step(c, g, w, gather_s, scatter_s);
  const double fwd = w.compute_s * (1 - w.backward_frac - w.optimizer_frac);
  const double bwd = w.compute_s * w.backward_frac;
  const double opt = w.compute_s * w.optimizer_frac;
  const double grad_bytes = 4 * w.params;
  const Costs& k = c.calibration->costs;
  compute(c, fwd);
  if (a == Algorithm::kRing || a == Algorithm::kTree || a == Algorithm::kByteGrad) {
    const int buckets = std::max(1, static_cast<int>(std::ceil(grad_bytes / w.bucket_bytes)));
    const double bucket = grad_bytes / buckets;
    // --shard gradients: bucket b (final b-th, from the end of the buffer) reduce-scattered to its holders.
    const Flat f(w, g.size());
    double scattering = 0;
    auto exchange_bucket = [&c, &g, &w, &f, &scattering, buckets, bucket, a](int b) {
      if (!w.gradients_sharded()) {
        allreduce(c, g, bucket, a);
        return;
      }
      const double t = sg4::Engine::get_clock();
      const auto total = f.total, nb = static_cast<std::size_t>(buckets), i = static_cast<std::size_t>(b);
      scatter_bucket(c, g, f, total - total * (i + 1) / nb, total - total * i / nb);
      scattering += sg4::Engine::get_clock() - t;
    };
    double t = 0;
    if (buckets == 1) {  // nothing to overlap: the exchange follows backward (one actor less per rank)
      compute(c, bwd);
      t = sg4::Engine::get_clock();
      exchange_bucket(0);
    } else {
      auto ready = sg4::Semaphore::create(0);
      auto comm = sg4::Actor::create("comm", sg4::this_actor::get_host(), [ready, buckets, &exchange_bucket] {
        for (int b = 0; b < buckets; ++b) {
          ready->acquire();
          exchange_bucket(b);
        }
      });
      for (int b = 0; b < buckets; ++b) {
        compute(c, bwd / buckets);
        ready->release();
      }
      t = sg4::Engine::get_clock();
      comm->join();
    }
    double exposed = sg4::Engine::get_clock() - t;
    if (scatter_s != nullptr) *scatter_s = scattering;
    if (!w.sharded()) {
      compute(c, opt + w.overhead_s_per_param * w.params);
      return exposed;
    }
    const int n = g.size();
    compute(c, opt * std::min(w.shard_replicas, n) / n + w.overhead_s_per_param * w.params);
    const double t_gather = sg4::Engine::get_clock();
    allgather_linear(c, g, 4 * w.params / n);  // shards differ by one element at most
    const double gather = sg4::Engine::get_clock() - t_gather;
    if (gather_s != nullptr) *gather_s = gather;
    return exposed + gather;
  }
  compute(c, bwd + opt + w.overhead_s_per_param * w.params);
  const double t = sg4::Engine::get_clock();
  const int n = g.size();
  const std::string tag = g.next_tag();
  auto box = [&tag](int m) { return tag + ":" + std::to_string(m); };
  if (a == Algorithm::kDecentralized) {
    // shift_one: a perfect matching per round (the first round's pairs 2i, 2i+1); an odd one sits out.
    const int peer = g.me ^ 1;
    if (peer < n) {
      auto out = send_async(c, box(peer), grad_bytes);
      recv(box(g.me));
      out->wait();
      compute(c, 2 * grad_bytes / k.reduce_Bps);
    }
  } else {  // low-precision decentralized: quantised differences to both ring neighbours
    compute(c, grad_bytes / k.encode_Bps);
    if (n > 1) {
      const int left = (g.me - 1 + n) % n, right = (g.me + 1) % n;
      auto l = send_async(c, box(left) + "r", wire_bytes(w.params));
      auto r = send_async(c, box(right) + "l", wire_bytes(w.params));
      recv(box(g.me) + "l");
      recv(box(g.me) + "r");
      l->wait();
      r->wait();
      compute(c, 2 * grad_bytes / k.decode_Bps + 3 * grad_bytes / k.reduce_Bps);
    }
  }
  return sg4::Engine::get_clock() - t;
}

double bytes_per_rank(const Workload& w, Algorithm a, int n) {
  if (n < 2) return 0;
  const double ring = 2.0 * (n - 1) / n;
  // Sharded, as Sinew's metrics count it (ShardedOptimizer::take_bytes_sent): a bandwidth-optimal
  // all-gather's or reduce-scatter's (n-1)/n of the buffer, plus the replicas' parts point to point (an
  // owner's 1/n to R-1 holders). ZeRO-2: a reduce-scatter, the parts, the gather after the update; ZeRO-3:
  // a reduce-scatter, the parts, and every unit gathered twice (forward, backward), no gather after.
  const double part = (n - 1.0) / n * 4 * w.params;
  const double replicas = (std::min(w.shard_replicas, n) - 1.0) / n * 4 * w.params;
  if (w.parameters_sharded()) return 3 * part + replicas;
  if (w.gradients_sharded()) return 2 * part + replicas;
  // ZeRO-1: the allreduce and the gather (the broadcasts' trees of a reshard send more in all).
  if (w.sharded()) {
    Workload whole = w;
    whole.shard_replicas = 0;
    return bytes_per_rank(whole, a, n) + (n - 1.0) / n * 4 * w.params;
  }
  switch (a) {
    case Algorithm::kRing:
    case Algorithm::kTree:
      return ring * 4 * w.params;
    case Algorithm::kByteGrad:
      return ring * wire_bytes(w.params);
    case Algorithm::kDecentralized:
      return 4 * w.params;
    case Algorithm::kLowPrecisionDecentralized:
      return 2 * wire_bytes(w.params);
  }
  return 0;
}

}  // namespace

Algorithm algorithm_from_name(const std::string& name) {
  if (name == "ring") return Algorithm::kRing;
  if (name == "tree") return Algorithm::kTree;
  if (name == "bytegrad") return Algorithm::kByteGrad;
  if (name == "decentralized") return Algorithm::kDecentralized;
  if (name == "low-precision-decentralized") return Algorithm::kLowPrecisionDecentralized;
  throw std::invalid_argument("unknown algorithm '" + name +
                              "'; use ring, tree, bytegrad, decentralized or low-precision-decentralized");
}

std::string algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kByteGrad:
      return "bytegrad";
    case Algorithm::kDecentralized:
      return "decentralized";
    case Algorithm::kLowPrecisionDecentralized:
      return "low-precision-decentralized";
  }
  return "?";
}

Mode mode_from_name(const std::string& name) {
  if (name == "in-place") return Mode::kInPlace;
  if (name == "spare") return Mode::kSpare;
  if (name == "spawn") return Mode::kSpawn;
  if (name == "restart") return Mode::kRestart;
  throw std::invalid_argument("unknown recovery mode '" + name + "'; use in-place, spare, spawn or restart");
}

std::string mode_name(Mode m) {
  switch (m) {
    case Mode::kInPlace:
      return "in-place";
    case Mode::kSpare:
      return "spare";
    case Mode::kSpawn:
      return "spawn";
    case Mode::kRestart:
      return "restart";
  }
  return "?";
}

Failure failure_from_name(const std::string& name) {
  if (name == "process") return Failure::kProcess;
  if (name == "node") return Failure::kNode;
  throw std::invalid_argument("unknown failure '" + name +
                              "'; use process (a rank killed) or node (a node lost)");
}

StepResult simulate_step(int& argc, char** argv, const Platform& p, const Calibration& cal, const Workload& w,
                         Algorithm a, int ranks, const Options& o) {
  sg4::Engine e(&argc, argv);
  configure(e, p, ranks);
  auto cluster = build_cluster(e, p, cal, ranks, o);
  std::vector<double> end(static_cast<std::size_t>(ranks)), exposed(end.size()), gather(end.size()),
      scatter(end.size());
  const Members world = make_members(iota(ranks));
  for (int r = 0; r < ranks; ++r) {
    sg4::Actor::create("rank" + std::to_string(r), cluster->nodes[static_cast<std::size_t>(r)],
                       [&c = *cluster, &w, a, r, &world, &end, &exposed, &gather, &scatter] {
                         Group g{"world", world, r};
                         const auto i = static_cast<std::size_t>(r);
                         exposed[i] = train_step(c, g, w, a, &gather[i], &scatter[i]);
                         end[i] = sg4::Engine::get_clock();
                       });
  }
  e.run();
  StepResult out;
  out.step_s = *std::max_element(end.begin(), end.end());
  out.exposed_comm_s = std::accumulate(exposed.begin(), exposed.end(), 0.0) / ranks;
  out.gather_s = std::accumulate(gather.begin(), gather.end(), 0.0) / ranks;
  out.scatter_s = std::accumulate(scatter.begin(), scatter.end(), 0.0) / ranks;
  out.compute_s = out.step_s - out.exposed_comm_s;
  out.bytes_per_rank = bytes_per_rank(w, a, ranks);
  // Only the ring's steps and the all-to-all's shifts are sampled (the tree, the decentralized
  // exchanges are simulated whole).
  const int shifts = ranks - 1;
  out.sampled = o.sample > 0 &&
                ((a == Algorithm::kRing && shifts > ring_sample_steps(o.sample)) ||
                 (a == Algorithm::kByteGrad && shifts > o.sample) || (w.sharded() && shifts > o.sample));
  return out;
}

namespace {

/// The phases of a recovery as each participant finishes them: a phase ends when its last participant
/// is done (the next one needs all of them: every step of a recovery is collective).
class Phases {
 public:
  explicit Phases(std::vector<std::string> names) : names_(std::move(names)), end_(names_.size(), 0) {}
  void done(const std::string& name) {
    const auto i = static_cast<std::size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
    if (i == names_.size()) throw std::logic_error("no phase " + name);
    end_[i] = std::max(end_[i], sg4::Engine::get_clock());
  }
  RecoveryResult result(double t_fail) const {
    RecoveryResult r;
    double prev = t_fail;
    for (std::size_t i = 0; i < names_.size(); ++i) {
      const double end = std::max(prev, end_[i]);
      r.parts_s.emplace_back(names_[i], end - prev);
      prev = end;
    }
    r.total_s = prev - t_fail;
    return r;
  }

 private:
  std::vector<std::string> names_;
  std::vector<double> end_;
};

/// A sharded job's reshard after the failure, as every survivor computes it (Sinew's own
/// train::plan_reshard, on the simulated membership): each old shard's parameters broadcast from its
/// source, the state's pieces that move between members, and what each member holds afterwards. Shared
/// by the members of the simulation.
struct Reshard {
  bool lost = false;  ///< a shard none of whose holders survived (R = 1): exit for a relaunch
  Broadcasts params;  ///< per old shard: its source (a member of the survivors) and its bytes
  std::vector<std::vector<Transfer>> sends, recvs;  ///< per member
  std::vector<double> held_bytes;  ///< per member: optimiser state (ZeRO-3: and parameters) held afterwards
  double moved_bytes = 0;          ///< state sent between members, in all
  int messages = 0;
};

Reshard plan_reshard(const Workload& w, int n, int victim) {
  Reshard r;
  const auto total = static_cast<std::size_t>(w.params);
  const train::ShardLayout old(total, n, w.shard_replicas), next(total, n - 1, w.shard_replicas);
  std::vector<int> old_rank, new_rank;
  for (int q = 0; q < n; ++q) {
    if (q == victim) continue;
    old_rank.push_back(q);
    new_rank.push_back(static_cast<int>(new_rank.size()));
  }
  const train::ReshardPlan plan = train::plan_reshard(old, old_rank, new_rank, next);
  r.lost = plan.lost >= 0;
  if (r.lost) return r;
  // ZeRO-1 and 2: every old shard's parameters broadcast from its source. ZeRO-3: none; each piece's
  // parameters go with its state, one message more per piece (kTagReshardParams).
  const bool with_params = w.parameters_sharded();
  for (int s = 0; s < n && !with_params; ++s) {
    r.params.roots.push_back(plan.source[static_cast<std::size_t>(s)]);
    r.params.bytes.push_back(4.0 * static_cast<double>(old.shard(s).count));
  }
  const auto m = static_cast<std::size_t>(n - 1);
  r.sends.resize(m);
  r.recvs.resize(m);
  r.held_bytes.assign(m, 0.0);
  // One message per piece and state buffer (reshard() sends each buffer's piece on its own); one flow
  // per pair of members in the simulation, with the overheads of all its messages.
  std::map<std::pair<int, int>, Transfer> pairs;
  const int buffers = w.optimizer_buffers + (with_params ? 1 : 0);
  const double per_elem = 4.0 * buffers;
  for (const train::ReshardPlan::Piece& piece : plan.pieces) {
    const double bytes = per_elem * static_cast<double>(piece.range.count);
    r.held_bytes[static_cast<std::size_t>(piece.to)] += bytes;
    if (piece.from == piece.to) continue;
    Transfer& t = pairs[{piece.from, piece.to}];
    t.messages += buffers;
    t.bytes += bytes;
    r.moved_bytes += bytes;
    r.messages += buffers;
  }
  for (const auto& [fromto, t] : pairs) {
    r.sends[static_cast<std::size_t>(fromto.first)].push_back({fromto.second, t.messages, t.bytes});
    r.recvs[static_cast<std::size_t>(fromto.second)].push_back({fromto.first, t.messages, t.bytes});
  }
  return r;
}

struct RecoveryRun {
  const Cluster& c;
  const Workload& w;
  Mode mode;
  Failure failure;
  int n;       ///< ranks before the failure
  int victim;  ///< the rank that dies (its node is nodes[victim])
  Phases phases;
  double t_fail = -1;
  std::vector<sg4::SemaphorePtr> told;                   ///< per node: its rank has learnt of the failure
  sg4::SemaphorePtr down = sg4::Semaphore::create(0);    ///< restart: a survivor has stopped
  sg4::SemaphorePtr exited = sg4::Semaphore::create(0);  ///< restart: the job has exited
  double step_s = 0;                        ///< the first step after recovery (the replay's unit)
  const Reshard* reshard = nullptr;         ///< a sharded job's (in place)
  std::string relaunched_after = "detect";  ///< the phase that ends when the failed job has exited
  [[nodiscard]] const InPlaceCosts& costs() const {
    const Costs& k = c.calibration->costs;
    return mode == Mode::kSpare ? k.spare : mode == Mode::kSpawn ? k.spawn : k.in_place;
  }
};

std::vector<std::string> phase_names(Mode m) {
  switch (m) {
    case Mode::kInPlace:
    case Mode::kSpare:
      return {"detect", "revoke", "shrink", "agree", "rebuild", "state sync", "other", "first step"};
    case Mode::kSpawn:
      return {"detect", "revoke", "shrink", "agree", "rebuild", "state sync", "spawn", "other", "first step"};
    case Mode::kRestart:
      return {"detect", "relaunch", "data load", "checkpoint load", "first step", "replay"};
  }
  return {};
}

/// A sharded job whose failure lost a shard (R = 1): the in-place recovery up to the reshard's plan, which
/// finds the shard lost; every survivor exits (75) and sinew-run relaunches the job from its newest
/// checkpoint, as a restart does.
std::vector<std::string> lost_shard_phase_names() {
  return {"detect", "revoke",   "shrink",    "agree",           "rebuild",    "state sync",
          "exit",   "relaunch", "data load", "checkpoint load", "first step", "replay"};
}

// Detection. A killed process: its node's runtime daemon notices and reports to the launcher, which
// tells every daemon down its tree, and each daemon its ranks (PRRTE's error propagation). A lost node:
// its rank's observer in ULFM's heartbeat ring misses the heartbeats for the timeout and broadcasts the
// failure over the survivors (only that pair's heartbeats are simulated; the others are background).
void start_detection(RecoveryRun& run, const Members& alive) {
  const Cluster& c = run.c;
  const Platform& p = *c.platform;
  const int vertices = static_cast<int>(alive->size()) + 2;  // the launcher, the nodes alive, the victim's
  if (run.failure == Failure::kProcess) {
    for (int v = 0; v < vertices; ++v) {
      sg4::Host* h = v == 0 ? c.launcher : c.nodes[static_cast<std::size_t>(v - 1)];
      sg4::Actor::create("daemon" + std::to_string(v), h, [&run, v, vertices] {
        if (v == 0) recv("report");
        if (v == run.victim + 1) {
          sg4::this_actor::sleep_until(run.t_fail);
          software(run.costs().notice_s);
          send_async(run.c, "report", 256)->wait();
        }
        daemon_broadcast(run.c, "failed", v, vertices, 256);
        if (v >= 1) run.told[static_cast<std::size_t>(v - 1)]->release();
      });
    }
    return;
  }
  // The heartbeats of the victim to its observer (the next rank), from time 0 until its node dies.
  const int observer = (run.victim + 1) % run.n;  // ranks are on nodes 0..n-1
  auto beat = sg4::Actor::create("heartbeat", c.nodes[static_cast<std::size_t>(run.victim)], [&run, &p] {
    for (;;) {
      static int beat_payload = 0;
      sg4::Mailbox::by_name("beat")->put_init(&beat_payload, 64)->detach();
      sg4::this_actor::sleep_for(p.detector.period_s);
    }
  });
  beat->daemonize();
  sg4::Actor::create("observer", c.nodes[static_cast<std::size_t>(observer)], [&run, &p, observer, alive] {
    auto* box = sg4::Mailbox::by_name("beat");
    for (;;) {
      try {
        box->get<int>(p.detector.timeout_s);
      } catch (const simgrid::TimeoutException&) {
        break;
      }
    }
    // Propagate over the processes alive, from the observer.
    const int root = static_cast<int>(std::find(alive->begin(), alive->end(), observer) - alive->begin());
    for (int i = 0; i < static_cast<int>(alive->size()); ++i) {
      const int node = (*alive)[static_cast<std::size_t>(i)];
      sg4::Actor::create("propagate", run.c.nodes[static_cast<std::size_t>(node)],
                         [&run, alive, i, root, node] {
                           Group g{"propagate", alive, i};
                           binomial_broadcast(run.c, g, root, run.costs().agree_hop_s);
                           run.told[static_cast<std::size_t>(node)]->release();
                         });
    }
  });
}

void kill_victim(RecoveryRun& run, const sg4::ActorPtr& victim) {
  sg4::Actor::create("fault", run.c.launcher, [&run, victim] {
    sg4::this_actor::sleep_until(run.t_fail);
    if (run.failure == Failure::kNode) {
      run.c.nodes[static_cast<std::size_t>(run.victim)]->turn_off();
    } else {
      victim->kill();
    }
  });
}

// In place: the survivors (and, for a spare, the pool's idle spare) revoke, shrink, agree, rebuild and
// take the state of the most advanced survivor; a spawn grows the group back by one new process.
void in_place(RecoveryRun& run, int node, const Members& group_nodes) {
  const Cluster& c = run.c;
  const InPlaceCosts& k = run.costs();
  const double hop = k.agree_hop_s;
  run.told[static_cast<std::size_t>(node)]->acquire();
  run.phases.done("detect");
  software(k.revoke_s);
  run.phases.done("revoke");
  Group g{"shrunk", group_nodes, index_of(*group_nodes, node)};
  agreement(c, g, hop);  // which processes failed
  small_allgather(c, g, 4);
  agreement(c, g, hop);  // the new communicator's context id
  software(k.shrink_s);
  run.phases.done("shrink");
  agreement(c, g, hop);
  run.phases.done("agree");
  software(k.rebuild_s);
  run.phases.done("rebuild");
  agreement(c, g, hop);  // who is the most advanced
  if (run.reshard == nullptr) {
    tree_broadcast(c, g, 0, run.w.state_bytes());
    software(k.sync_s);
    run.phases.done("state sync");
    return;
  }
  // Sharded (ShardedOptimizer::reshard): who held what (an allgather of 3 int64 per member), the plan,
  // then each old shard's parameters from its source (ZeRO-1 and 2; none with ZeRO-3, whose pieces carry
  // them) and the state's pieces point to point, into fresh buffers. The rest of the state sync (the
  // position, the checksum) is the fitted software part.
  const Reshard& r = *run.reshard;
  small_allgather(c, g, 24);
  software(run.w.plan_s);
  if (r.lost) {
    run.phases.done("state sync");
    return;
  }
  sequential_broadcasts(c, g, r.params.roots, r.params.bytes);
  exchange(c, g, r.sends[static_cast<std::size_t>(g.me)], r.recvs[static_cast<std::size_t>(g.me)]);
  software(run.w.reshard_s_per_byte * r.held_bytes[static_cast<std::size_t>(g.me)]);
  software(k.sync_s);
  run.phases.done("state sync");
}

void first_step(RecoveryRun& run, Group& g) {
  const double t = sg4::Engine::get_clock();
  software(run.costs().other_s);
  run.phases.done("other");
  software(run.costs().first_step_s);
  train_step(run.c, g, run.w, Algorithm::kRing);
  run.phases.done("first step");
  run.step_s = std::max(run.step_s, sg4::Engine::get_clock() - t);
}

// Growth by spawn: the survivors' root asks the launcher for one process on a free node (a daemon is
// started there first unless on the one machine of "local"); the newcomer starts, reads the data set,
// and joins: intercommunicator merge, rebuild of the grown group, state sync.
void spawn_survivor(RecoveryRun& run, Group& survivors, const Members& grown) {
  const Cluster& c = run.c;
  if (survivors.me == 0) send_async(c, "spawn", 256)->wait();
  Group g{"grown", grown, survivors.me};
  agreement(c, g, run.costs().agree_hop_s);  // merge
  small_allgather(c, g, 64);
  software(c.calibration->costs.merge_s);
  agreement(c, g, run.costs().agree_hop_s);  // rebuilt: the newcomer is ready
  agreement(c, g, run.costs().agree_hop_s);  // state sync
  tree_broadcast(c, g, 0, run.w.state_bytes());
  software(run.costs().sync_s);
  run.phases.done("spawn");
  first_step(run, g);
}

void spawn_launcher(RecoveryRun& run, int new_node, const Members& grown) {
  const Cluster& c = run.c;
  const Platform& p = *c.platform;
  const Costs& k = c.calibration->costs;
  recv("spawn");
  software(p.runtime.hop_s);
  sg4::Actor::create("newcomer", c.nodes[static_cast<std::size_t>(new_node)],
                     [&run, new_node, grown, &p, &k] {
                       const Cluster& cl = run.c;
                       if (!p.local) software(p.runtime.daemon_start_s);
                       software(k.spawn_s);
                       Group g{"grown", grown, static_cast<int>(grown->size()) - 1};
                       agreement(cl, g, run.costs().agree_hop_s);  // merge
                       small_allgather(cl, g, 64);
                       software(k.merge_s);
                       if (p.local) {
                         software(k.data_s);
                       } else {
                         pfs_read(cl, new_node, 0, k.dataset_bytes, 0, 1);
                       }
                       software(k.grow_rebuild_s);
                       agreement(cl, g, run.costs().agree_hop_s);  // rebuilt
                       agreement(cl, g, run.costs().agree_hop_s);  // state sync
                       tree_broadcast(cl, g, 0, run.w.state_bytes());
                       software(run.costs().sync_s);
                       run.phases.done("spawn");
                       first_step(run, g);
                     });
}

// Restart: the runtime tears the job down; the supervisor launches it again over the daemon tree
// (daemons, processes, the PMIx fence that exchanges every process's endpoints), every rank reads the
// data set and the latest checkpoint, takes a first step and replays the steps since that checkpoint.
void restart(RecoveryRun& run, const Members& nodes) {
  const Cluster& c = run.c;
  const Platform& p = *c.platform;
  const Costs& k = c.calibration->costs;
  const int vertices = static_cast<int>(nodes->size()) + 1;
  for (int v = 0; v < vertices; ++v) {
    sg4::Host* h =
        v == 0 ? c.launcher : c.nodes[static_cast<std::size_t>((*nodes)[static_cast<std::size_t>(v - 1)])];
    sg4::Actor::create("launch" + std::to_string(v), h, [&run, v, vertices, nodes, &p, &k] {
      const Cluster& cl = run.c;
      if (v == 0) {  // the supervisor relaunches once mpirun has exited
        run.exited->acquire();
        run.phases.done(run.relaunched_after);
        software(k.launch_s);
      }
      daemon_broadcast(cl, "launch", v, vertices, 4096);  // start the daemons
      if (v >= 1 && !p.local) software(p.runtime.daemon_start_s);
      daemon_gather(cl, "up", v, vertices, 64);
      daemon_broadcast(cl, "procs", v, vertices, 4096);  // start the ranks
      // A node's daemon starts its ranks one after the other (all of them on the one machine of "local").
      if (v >= 1) software(k.proc_start_s * (p.local ? static_cast<double>(nodes->size()) : 1.0));
      daemon_gather(cl, "fence", v, vertices, 256);  // PMIx fence: every rank's endpoints
      daemon_broadcast(cl, "cards", v, vertices, 256.0 * static_cast<double>(nodes->size()));
      if (v == 0) return;
      run.phases.done("relaunch");
      const int rank = v - 1, node = (*nodes)[static_cast<std::size_t>(rank)];
      if (p.local) {
        software(k.data_s);
      } else {
        pfs_read(cl, node, 0, k.dataset_bytes, rank, static_cast<int>(nodes->size()));
      }
      run.phases.done("data load");
      if (!p.local) pfs_read(cl, node, 1, k.ckpt_bytes, rank, static_cast<int>(nodes->size()));
      software(k.ckpt_load_s);
      run.phases.done("checkpoint load");
      Group g{"restarted", nodes, rank};
      // The restarted ranks agree on the checkpoint they resumed from before they train: the first
      // step starts together, not in the order the loads finished.
      agreement(cl, g, k.in_place.agree_hop_s);
      software(k.restart_first_step_s);
      const double t = sg4::Engine::get_clock();
      train_step(cl, g, run.w, Algorithm::kRing);
      const double step = sg4::Engine::get_clock() - t;  // a steady step, less the first one's extra
      run.phases.done("first step");
      // The replay: steady steps, all alike, like the one just taken.
      sg4::this_actor::sleep_for(std::max(0, k.replay_steps - 1) * step);
      run.phases.done("replay");
    });
  }
}

}  // namespace

RecoveryResult simulate_recovery(int& argc, char** argv, const Platform& p, const Calibration& cal,
                                 const Workload& w, Mode m, Failure f, int ranks, const Options& o) {
  if (ranks < 2) throw std::invalid_argument("a recovery needs at least 2 ranks");
  sg4::Engine e(&argc, argv);
  configure(e, p, ranks);
  const int extra = 1;  // the spare, the node a replacement is spawned on, or the restart's replacement
  auto cluster = build_cluster(e, p, cal, ranks + extra, o);
  if (w.sharded() && m != Mode::kInPlace)
    throw std::invalid_argument("a sharded job's recovery is modelled in place only (--mode in-place)");
  Reshard reshard;
  if (w.sharded()) reshard = plan_reshard(w, ranks, ranks / 2);
  const bool lost = w.sharded() && reshard.lost;
  RecoveryRun run{
      *cluster, w, m, f, ranks, ranks / 2, Phases(lost ? lost_shard_phase_names() : phase_names(m)), -1, {}};
  if (w.sharded()) run.reshard = &reshard;
  if (lost) run.relaunched_after = "exit";
  for (int i = 0; i < ranks + extra; ++i) run.told.push_back(sg4::Semaphore::create(0));

  // Before the failure: a step's computation; the victim dies as it enters the allreduce (the
  // benchmark's fault point), the others block in it until they learn of the failure. (The steps
  // before it change nothing that is measured from the failure on, and are not simulated.)
  const double t_compute = w.compute_s * (1 - w.optimizer_frac);
  const int new_node = ranks;  // the extra node
  std::vector<int> before;
  for (int r = 0; r < ranks; ++r) {
    if (r != run.victim) before.push_back(r);
  }
  // The groups after the failure (node indices, ascending): the survivors, with the spare, with the
  // spawned process.
  const Members survivors = make_members(before);
  before.push_back(new_node);
  const Members with_new = make_members(before);
  const Members& recovered = m == Mode::kSpare ? with_new : survivors;
  sg4::ActorPtr victim;
  for (int r = 0; r < ranks; ++r) {
    auto actor = sg4::Actor::create("rank" + std::to_string(r), cluster->nodes[static_cast<std::size_t>(r)],
                                    [&run, r, t_compute, &recovered, &with_new] {
                                      const Cluster& c = run.c;
                                      compute(c, t_compute);
                                      if (r == run.victim) {
                                        run.t_fail = sg4::Engine::get_clock();
                                        sg4::this_actor::suspend();  // killed from here
                                        return;
                                      }
                                      if (run.mode == Mode::kRestart) {
                                        run.told[static_cast<std::size_t>(r)]->acquire();
                                        run.down->release();
                                        return;  // torn down
                                      }
                                      in_place(run, r, recovered);
                                      if (run.relaunched_after == "exit") {  // a shard lost: exit 75
                                        run.down->release();
                                        return;
                                      }
                                      Group g{"recovered", recovered, index_of(*recovered, r)};
                                      if (run.mode == Mode::kSpawn) {
                                        spawn_survivor(run, g, with_new);
                                      } else {
                                        first_step(run, g);
                                      }
                                    });
    if (r == run.victim) victim = actor;
  }
  if (m == Mode::kSpare) {  // the idle spare of the pool: it learns of the failure like the members
    sg4::Actor::create("spare", cluster->nodes[static_cast<std::size_t>(new_node)],
                       [&run, &with_new, new_node] {
                         in_place(run, new_node, with_new);
                         Group g{"recovered", with_new, static_cast<int>(with_new->size()) - 1};
                         first_step(run, g);
                       });
  }
  if (m == Mode::kSpawn) {
    sg4::Actor::create("launcher", cluster->launcher,
                       [&run, new_node, &with_new] { spawn_launcher(run, new_node, with_new); });
  }
  const Members& alive = recovered;                      // the processes that learn of the failure
  if (f == Failure::kNode) start_detection(run, alive);  // the heartbeats run from the start
  // The failure's time is known once the victim reaches its fault point; detection starts from there.
  sg4::Actor::create("start", cluster->launcher, [&run, victim, ranks, m, &alive, new_node, lost] {
    while (run.t_fail < 0) sg4::this_actor::sleep_for(1e-4);
    kill_victim(run, victim);
    if (run.failure == Failure::kProcess) start_detection(run, alive);
    // A restart, or a sharded job that lost a shard: the survivors stop (torn down, or exit 75 after
    // the in-place recovery's plan), mpirun exits, the supervisor relaunches.
    if (m == Mode::kRestart || lost) {
      // Tear-down: after the survivors' daemons heard (detection), the launcher kills every rank, the
      // daemons confirm, and the supervisor sees mpirun exit.
      sg4::Actor::create("teardown", run.c.launcher, [&run, ranks] {
        for (int r = 1; r < ranks; ++r) run.down->acquire();
        software(run.c.calibration->costs.exit_s);
        run.exited->release();
      });
      // The job starts again on the same nodes; a lost node is replaced by the spare node.
      std::vector<int> nodes = iota(ranks);
      if (run.failure == Failure::kNode) nodes[static_cast<std::size_t>(run.victim)] = new_node;
      restart(run, make_members(std::move(nodes)));
    }
  });
  e.run();
  RecoveryResult r = run.phases.result(run.t_fail);
  r.ranks_after = m == Mode::kInPlace && !lost ? ranks - 1 : ranks;
  if (w.sharded() && !lost) {
    r.moved_state_bytes = reshard.moved_bytes;
    r.moved_state_messages = reshard.messages;
    r.broadcast_bytes = std::accumulate(reshard.params.bytes.begin(), reshard.params.bytes.end(), 0.0);
  }
  return r;
}

}  // namespace sinew::sim
