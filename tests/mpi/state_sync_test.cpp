// train::ReplicatedState::synchronise over every rank of the world: after a change of membership every
// member holds the same state. With a lockstep algorithm that is the most advanced member's; after a
// failure with an algorithm whose ranks step on their own (rewind), the average of the rewound members'
// agreed states, which a newcomer (step -1, no state, no rewind of its own) takes too.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "sinew/comm/mpi/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/pages.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/model/workload.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/train/replicated_state.hpp"
#include "sinew/train/shards.hpp"

using namespace sinew;

namespace {

/// One member's state: a small MLP, SGD with momentum, a sampler; element i of every tensor set to
/// `value(i)`.
struct Member {
  Member()
      : work(model::Model::build("mlp:8", model::Shape{1, 4, 4}, 3, 7),
             optim::make_optimizer(optim::OptimizerOptions{}, 4 * 4 * 8 + 8 + 8 * 3 + 3), data, data),
        sampler(1000, 7),
        state(work, sampler, 7) {}

  template <class F>
  void fill(F value) {
    for (const auto& [name, buf] : state.tensors())
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = value(i);
  }

  data::Dataset data;  // not read: the test fills the tensors itself
  model::ModelWorkload work;
  data::DistributedSampler sampler;
  train::ReplicatedState state;
};

float agreed_value(int rank, std::size_t i) {
  return static_cast<float>(rank + 1) + 0.001f * static_cast<float>(i % 97);
}

}  // namespace

TEST(StateSync, LockstepTakesTheMostAdvancedMember) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank();
  Member m;
  m.fill([r](std::size_t i) { return agreed_value(r, i); });
  m.state.pos().step = r == 1 ? 12 : 11;  // rank 1 got one step further
  m.state.synchronise(backend, comm::Options{});
  EXPECT_EQ(m.state.pos().step, 12);
  for (const auto& [name, buf] : m.state.tensors())
    for (std::size_t i = 0; i < buf.size(); ++i)
      ASSERT_EQ(buf[i], agreed_value(1, i)) << name << "[" << i << "]";
}

TEST(StateSync, RewoundMembersAverageTheirAgreedStatesAndANewcomerTakesIt) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank();
  const int n = backend.size();
  const int newcomer = n - 1;  // a spawned replacement or a promoted spare: no state of its own
  Member m;
  if (r != newcomer) {
    m.fill([r](std::size_t i) { return agreed_value(r, i); });
    m.state.pos().step = 20;
    m.state.mark_agreed();
    // Steps taken on its own after the agreement (up to the failure): rewound, not kept.
    m.fill([r](std::size_t) { return 100.f + static_cast<float>(r); });
    m.state.pos().step = 20 + r;
  } else {
    m.fill([](std::size_t) { return -5.f; });
    m.state.pos().step = -1;
  }
  m.state.synchronise(backend, comm::Options{}, /*rewind=*/r != newcomer);
  EXPECT_EQ(m.state.pos().step, 20);
  const int members = n - 1;
  for (const auto& [name, buf] : m.state.tensors()) {
    for (std::size_t i = 0; i < buf.size(); ++i) {
      float sum = 0;
      for (int k = 0; k < members; ++k) sum += agreed_value(k, i);
      ASSERT_NEAR(buf[i], sum / static_cast<float>(members), 1e-5f) << name << "[" << i << "]";
    }
  }
  // And bit for bit the same on every rank.
  std::vector<float> mine(m.work.params().begin(), m.work.params().end());
  std::vector<float> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(mine, root);
}

namespace {

/// A member whose optimiser state is sharded (--shard optimizer): the workload has no optimiser.
struct ShardedMember {
  static constexpr std::size_t kParams = 4 * 4 * 8 + 8 + 8 * 3 + 3;
  explicit ShardedMember(optim::OptimizerOptions o)
      : work(model::Model::build("mlp:8", model::Shape{1, 4, 4}, 3, 7), nullptr, data, data, o.name),
        sampler(1000, 7),
        shards(o, kParams, 2),
        state(work, sampler, 7) {
    state.attach_shards(&shards);
  }
  data::Dataset data;
  model::ModelWorkload work;
  data::DistributedSampler sampler;
  train::ShardedOptimizer shards;
  train::ReplicatedState state;
};

float gradient(int step, std::size_t i) {
  return 0.01f * static_cast<float>(step) * std::cos(static_cast<float>(i));
}

/// Every held shard of `m` (parameters and state) equals the whole optimiser's after the same steps.
void expect_as_whole(ShardedMember& m, const std::vector<float>& params, optim::Optimizer& whole) {
  const auto p = m.work.params();
  for (std::size_t i = 0; i < p.size(); ++i) ASSERT_EQ(p[i], params[i]) << "params[" << i << "]";
  EXPECT_EQ(m.shards.steps(), whole.steps());
  const auto ws = whole.state();
  for (const auto& h : m.shards.held()) {
    const auto hs = h.opt->state();
    for (std::size_t k = 0; k < ws.size(); ++k)
      for (std::size_t i = 0; i < h.range.count; ++i)
        ASSERT_EQ(hs[k].second[i], ws[k].second[h.range.offset + i])
            << ws[k].first << " of shard " << h.shard;
  }
}

}  // namespace

namespace {

/// Two steps on every member, the last member's reduction of step 2 failing (a peer died in it: its
/// gradients are garbage and it does not update), then the state sync: every member ends as if all had
/// stepped twice.
void last_member_behind(bool gradients_sharded) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank(), n = backend.size();
  optim::OptimizerOptions o;
  o.name = "adam";
  ShardedMember m(o);
  m.shards.set_gradients_sharded(gradients_sharded);
  m.shards.arrange(r, n);
  auto whole = optim::make_optimizer(o, ShardedMember::kParams);
  std::vector<float> params(m.work.params().begin(), m.work.params().end());
  std::vector<float> g(params.size());
  for (int step = 1; step <= 2; ++step) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = gradient(step, i);
    whole->step(params, g, 0.01f * static_cast<float>(step));
    const bool behind = step == 2 && r == n - 1;
    auto grads = m.work.grads();
    for (std::size_t i = 0; i < g.size(); ++i) grads[i] = behind ? -1.f : g[i];
    if (behind) break;
    m.shards.step(m.work.params(), m.work.grads(), 0.01f * static_cast<float>(step));
    m.state.pos().step = step;
    if (step == 1) m.shards.gather(backend, m.work.params(), comm::Options{});
  }
  m.state.synchronise(backend, comm::Options{});
  EXPECT_EQ(m.state.pos().step, 2);
  EXPECT_EQ(m.shards.layout().world, n);
  expect_as_whole(m, params, *whole);
}

}  // namespace

// A member whose reduction of the last step failed while the others completed it did not update its shards:
// it repeats that update with the root's reduced gradients and learning rate (train/shards.hpp).
TEST(StateSync, ShardedMemberOneStepBehindRepeatsTheUpdate) { last_member_behind(false); }

// --shard gradients: such a member has no reduced gradients of its shards to repeat the update with; it gives
// its shards up and takes them from holders that completed the step.
TEST(StateSync, ShardedGradientsMemberBehindTakesItsShardsFromTheirHolders) { last_member_behind(true); }

// --shard gradients (ZeRO-2): each bucket is reduce-scattered to the shards' holders, who hold the sum of
// their shards' gradients; the rest of the bucket is NaN (this member does not hold it).
TEST(StateSync, ShardedGradientsReachEveryHolderOfTheirShard) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank(), n = backend.size();
  optim::OptimizerOptions o;
  o.name = "adam";
  ShardedMember m(o);
  m.shards.arrange(r, n);
  auto grads = m.work.grads();
  for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = gradient(r + 1, i);
  // Two buckets that cut across the shards' boundaries, as the bucketer's do.
  const std::size_t cut = grads.size() / 3;
  m.shards.scatter_bucket(backend, grads.subspan(0, cut), 0, comm::Options{});
  m.shards.scatter_bucket(backend, grads.subspan(cut), cut, comm::Options{});
  for (std::size_t i = 0; i < grads.size(); ++i) {
    float sum = 0;
    for (int q = 0; q < n; ++q) sum += gradient(q + 1, i);
    if (m.shards.holds(i)) {
      ASSERT_NEAR(grads[i], sum, 1e-6f * (1 + std::abs(sum))) << i;
    } else {
      ASSERT_TRUE(std::isnan(grads[i])) << i;
    }
  }
  EXPECT_GT(m.shards.take_bytes_sent(), 0u);
}

// A bucket of one large layer is reduce-scattered in chunks (bounding MPI's temporaries): 2.5 M elements.
TEST(StateSync, ShardedGradientsOfABucketLargerThanAChunk) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank(), n = backend.size();
  optim::OptimizerOptions o;
  o.name = "sgd";
  const std::size_t total = 2'500'003;
  train::ShardedOptimizer shards(o, total, 2);
  shards.arrange(r, n);
  std::vector<float> grads(total);
  for (std::size_t i = 0; i < total; ++i) grads[i] = static_cast<float>((i % 1000) * (r + 1));
  shards.scatter_bucket(backend, grads, 0, comm::Options{});
  const float ranks = static_cast<float>(n * (n + 1) / 2);
  for (std::size_t i = 0; i < total; ++i) {
    if (shards.holds(i)) {
      ASSERT_EQ(grads[i], static_cast<float>(i % 1000) * ranks) << i;
    } else {
      ASSERT_TRUE(std::isnan(grads[i])) << i;
    }
  }
}

// A newcomer (a spawned replacement) holds nothing; the members laid out over one rank fewer reshard over
// the grown group, and it receives its shards from their memory.
TEST(StateSync, ShardedNewcomerReceivesItsShards) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank(), n = backend.size();
  optim::OptimizerOptions o;
  o.name = "adam";
  ShardedMember m(o);
  const bool newcomer = r == n - 1;
  auto whole = optim::make_optimizer(o, ShardedMember::kParams);
  std::vector<float> params(m.work.params().begin(), m.work.params().end());
  std::vector<float> g(params.size());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = gradient(1, i);
  whole->step(params, g, 0.01f);
  if (newcomer) {
    m.state.pos().step = -1;
    for (auto& x : m.work.params()) x = 0;
  } else {
    m.shards.arrange(r, n - 1);
    std::copy(g.begin(), g.end(), m.work.grads().begin());
    m.shards.step(m.work.params(), m.work.grads(), 0.01f);  // stale ranges: the reshard broadcasts them
    m.state.pos().step = 1;
  }
  m.state.synchronise(backend, comm::Options{});
  EXPECT_EQ(m.state.pos().step, 1);
  EXPECT_EQ(m.shards.layout().world, n);
  expect_as_whole(m, params, *whole);
}

namespace {
float value(std::size_t i) { return 1.f + static_cast<float>(i % 9973); }

/// Every element this member holds is `value`; every page without a held element inside `released` (the
/// whole buffer by default; a released range's edge pages keep their memory) reads zero: it was given back.
void expect_held_only(const train::ShardedOptimizer& s, std::span<const float> p,
                      std::vector<Slice> released = {}) {
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) / sizeof(float);
  if (released.empty()) released.push_back({0, p.size()});
  const auto inside = [&](std::size_t first, std::size_t last) {
    return std::any_of(released.begin(), released.end(),
                       [&](Slice r) { return first >= r.offset && last <= r.end(); });
  };
  for (std::size_t first = 0; first < p.size(); first += page) {
    const std::size_t last = std::min(p.size(), first + page);
    if (!inside(first, last) || last - first < page) continue;  // (the buffer's last page is not whole in it)
    bool any = false;
    for (std::size_t i = first; i < last; ++i) {
      if (s.holds(i)) {
        ASSERT_EQ(p[i], value(i)) << "held element " << i;
        any = true;
      }
    }
    if (!any) {
      for (std::size_t i = first; i < last; ++i) ASSERT_EQ(p[i], 0.f) << "element " << i << " (not held)";
    }
  }
}
}  // namespace

// --shard parameters (ZeRO-3): a member keeps its shards of the model in memory; after a growth a newcomer
// receives its shards' parameters from their holders, point to point; a unit's ranges are gathered from their
// owners and released again.
TEST(StateSync, ShardedParametersGatherReleaseAndReshard) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank(), n = backend.size();
  if (n < 2) GTEST_SKIP() << "needs a newcomer and a member";
  optim::OptimizerOptions o;
  o.name = "adam";
  const std::size_t total = 1'000'003;
  MappedFloats params(total);
  const auto p = params.span();
  const bool newcomer = r == n - 1;
  train::ShardedOptimizer shards(o, total, 2);
  shards.set_parameters_sharded(true);
  EXPECT_TRUE(shards.gradients_sharded());
  if (!newcomer) {
    for (std::size_t i = 0; i < total; ++i) p[i] = value(i);  // the whole model, as built
    shards.arrange(r, n - 1, p);                              // the members trained without the newcomer
    expect_held_only(shards, p);
  }
  shards.reshard(backend, p, comm::Options{}, r, n);
  EXPECT_EQ(shards.layout().world, n);
  expect_held_only(shards, p);
  const std::vector<Slice> unit{{total / 7, total / 3}, {total - 1000, 1000}};
  shards.gather_ranges(backend, p, unit, comm::Options{});
  for (const Slice u : unit)
    for (std::size_t i = u.offset; i < u.end(); ++i) ASSERT_EQ(p[i], value(i)) << "gathered element " << i;
  EXPECT_GT(shards.take_bytes_sent(), 0u);
  shards.release(p, unit);
  expect_held_only(shards, p, unit);

  // An embedding's rows (gather_rows): each member asks its own rows, some across the shards' boundaries,
  // member 1 none; they arrive whole, and nothing else of the table is written.
  const std::size_t width = 1000;
  const Slice table{1, 1000 * width};
  std::vector<std::int64_t> rows;
  if (r != 1) {
    for (int s = 1; s < n; ++s)  // the row that crosses shard s's first element
      rows.push_back(static_cast<std::int64_t>((shards.layout().shard(s).offset - table.offset) / width));
    rows.push_back(std::int64_t{11} * r);
    rows.push_back(999);
    std::sort(rows.begin(), rows.end());
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  }
  shards.release_unheld(p);  // (the unit's edge pages above kept their values)
  shards.gather_rows(backend, p, table, width, rows, comm::Options{});
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE)) / sizeof(float);
  // A page that holds a held element keeps its values, and so does the buffer's last page (not whole in it).
  std::vector<signed char> held_page((total + page - 1) / page, -1);  // -1: not known yet
  const auto on_held_page = [&](std::size_t i) {
    auto& known = held_page[i / page];
    if (known < 0) {
      const std::size_t first = i / page * page;
      known = first + page > total ? 1 : 0;
      for (std::size_t e = first; known == 0 && e < first + page; ++e) known = shards.holds(e) ? 1 : 0;
    }
    return known == 1;
  };
  for (std::int64_t k = 0; k < 1000; ++k) {
    const bool asked = std::binary_search(rows.begin(), rows.end(), k);
    for (std::size_t i = table.offset + static_cast<std::size_t>(k) * width;
         i < table.offset + (k + 1) * width; ++i) {
      if (asked || shards.holds(i)) {
        ASSERT_EQ(p[i], value(i)) << "row " << k << ", element " << i;
      } else if (!on_held_page(i)) {
        ASSERT_EQ(p[i], 0.f) << "row " << k << " (not asked), element " << i;
      }
    }
  }
  unsigned long long sent = shards.take_bytes_sent(), all_sent = 0;
  MPI_Allreduce(&sent, &all_sent, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (n > 2) {  // (at 2 ranks with R = 2 each holds everything)
    EXPECT_GT(all_sent, 0u);
  }
  shards.release(p, std::span<const Slice>(&table, 1));
  expect_held_only(shards, p);
  EXPECT_THROW(shards.gather_rows(backend, p, table, width, std::vector<std::int64_t>{5, 3}, comm::Options{}),
               InternalError);
}

// A planned leave of the last member (the job server's shrink): the members that stay take its shards over at
// R = 2 on one member fewer (at 2 members the one that stays holds everything). What a member kept is not copied: its whole pages move into the new buffers,
// which the reshard placed for it (optim::StatePlacement), and every value is then the whole optimiser's.
TEST(StateSync, ShardedReshardMovesTheKeptPagesIntoTheNewLayout) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank(), n = backend.size();
  optim::OptimizerOptions o;
  o.name = "adam";
  const std::size_t total = std::size_t{3} << 20;  // 12 MiB per state buffer
  train::ShardedOptimizer shards(o, total, 2);
  shards.arrange(r, n);
  std::vector<float> params(total), grads(total);
  for (std::size_t i = 0; i < total; ++i) {
    params[i] = value(i);
    grads[i] = 0.001f * std::cos(static_cast<float>(i));
  }
  std::vector<float> whole_params = params;
  auto whole = optim::make_optimizer(o, total);
  for (int step = 0; step < 2; ++step) {
    whole->step(whole_params, grads, 0.01f);
    shards.step(params, grads, 0.01f);  // (its held ranges only: the reshard brings the others)
  }
  const bool leaves = r == n - 1;
  shards.reshard(backend, params, comm::Options{}, leaves ? -1 : r, n - 1);
  if (leaves) {
    EXPECT_TRUE(shards.held().empty());
    return;
  }
  EXPECT_EQ(shards.layout().world, n - 1);
  EXPECT_GT(shards.last_moved_bytes(), std::size_t{1} << 20) << "member " << r;
  for (std::size_t i = 0; i < total; ++i) ASSERT_EQ(params[i], whole_params[i]) << "params[" << i << "]";
  const auto ws = whole->state();
  for (const auto& h : shards.held()) {
    const auto hs = h.opt->state();
    for (std::size_t k = 0; k < ws.size(); ++k)
      for (std::size_t i = 0; i < h.range.count; ++i)
        ASSERT_EQ(hs[k].second[i], ws[k].second[h.range.offset + i])
            << ws[k].first << " of shard " << h.shard;
  }
}
