#include "sinew/train/shards.hpp"

#include <algorithm>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sinew/core/error.hpp"
#include "sinew/core/pages.hpp"
#include "sinew/core/status.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/train/layer_options.hpp"

namespace sinew::train {

namespace {

constexpr int kTagReshard = 111;  // the state pieces of a reshard (point to point over the new view)
constexpr int kTagScatter = 112;  // scatter_bucket's reduced parts, from a shard's owner to its other holders
constexpr int kTagReshardParams = 113;  // --shard parameters: the parameters of the pieces of a reshard
const float kNotHeld = std::numeric_limits<float>::quiet_NaN();
constexpr std::size_t kScatterChunk = 1u << 20;  // elements per reduce-scatter of scatter_bucket (4 MiB)

Slice intersect(Slice a, Slice b) {
  const std::size_t lo = std::max(a.offset, b.offset), hi = std::min(a.end(), b.end());
  return hi > lo ? Slice{lo, hi - lo} : Slice{lo, 0};
}

/// Part `r` of `bucket`, the flat buffer's elements from `offset` on; empty where `r` is (the offset of an
/// empty intersection may lie past the bucket's end).
std::span<float> part_of(std::span<float> bucket, std::size_t offset, Slice r) {
  return r.count == 0 ? bucket.first(0) : bucket.subspan(r.offset - offset, r.count);
}

/// Whether member `rank` of `l` holds shard `s`.
bool holds(const ShardLayout& l, int rank, int s) {
  if (rank < 0 || rank >= l.world) return false;
  const int d = (rank - s + l.world) % l.world;
  return d % l.stride() == 0 && d / l.stride() < l.replicas;
}

}  // namespace

ShardLayout::ShardLayout(std::size_t total_, int world_, int replicas_)
    : total(total_), world(world_), replicas(std::clamp(replicas_, 1, std::max(world_, 1))) {
  SINEW_ENFORCE(world_ >= 1, "a shard layout over {} members", world_);
}

Slice ShardLayout::shard(int s) const {
  const auto w = static_cast<std::size_t>(world), i = static_cast<std::size_t>(s);
  const std::size_t lo = total * i / w, hi = total * (i + 1) / w;
  return {lo, hi - lo};
}

int ShardLayout::shard_of(std::size_t e) const {
  SINEW_ENFORCE(e < total, "element {} of a layout of {}", e, total);
  const auto w = static_cast<std::size_t>(world);
  // shard(s).offset = floor(total*s/w) <= e: s = floor(e*w/total) is that or one below the shard sought.
  auto s = static_cast<int>(e * w / total);
  while (s + 1 < world && shard(s + 1).offset <= e) ++s;
  return s;
}

std::vector<int> ShardLayout::held_by(int rank) const {
  std::vector<int> s;
  s.reserve(static_cast<std::size_t>(replicas));
  for (int k = 0; k < replicas; ++k) s.push_back(((rank - k * stride()) % world + world) % world);
  return s;
}

std::vector<int> ShardLayout::holders(int s) const {
  std::vector<int> r;
  r.reserve(static_cast<std::size_t>(replicas));
  for (int k = 0; k < replicas; ++k) r.push_back((s + k * stride()) % world);
  return r;
}

ReshardPlan plan_reshard(const ShardLayout& old, const std::vector<int>& old_rank,
                         const std::vector<int>& new_rank, const ShardLayout& next) {
  SINEW_ENFORCE(old_rank.size() == new_rank.size(), "reshard plan over {} and {} members", old_rank.size(),
                new_rank.size());
  ReshardPlan p;
  p.source.assign(static_cast<std::size_t>(old.world), -1);
  // Linear in the members (times R and the pieces): a plan at 16 384 ranks is computed in milliseconds.
  for (std::size_t q = 0; q < old_rank.size(); ++q) {  // ascending: each shard's lowest surviving holder
    if (old_rank[q] < 0 || old_rank[q] >= old.world) continue;
    for (const int s : old.held_by(old_rank[q]))
      if (p.source[static_cast<std::size_t>(s)] < 0)
        p.source[static_cast<std::size_t>(s)] = static_cast<int>(q);
  }
  for (int s = 0; s < old.world && p.lost < 0; ++s)
    if (p.source[static_cast<std::size_t>(s)] < 0) p.lost = s;
  if (p.lost >= 0) return p;
  for (std::size_t qi = 0; qi < new_rank.size(); ++qi) {
    if (new_rank[qi] < 0) continue;
    const int q = static_cast<int>(qi);
    for (const int to_shard : next.held_by(new_rank[qi])) {
      const Slice want = next.shard(to_shard);
      if (want.count == 0) continue;
      // The old shards that overlap it, from the one that holds its first element on.
      for (int s = old.shard_of(want.offset); s < old.world && old.shard(s).offset < want.end(); ++s) {
        const Slice piece = intersect(old.shard(s), want);
        if (piece.count == 0) continue;
        // A member that held the piece keeps it (no message); else the shard's source sends it.
        const int from = holds(old, old_rank[qi], s) ? q : p.source[static_cast<std::size_t>(s)];
        p.pieces.push_back({from, q, to_shard, piece});
      }
    }
  }
  return p;
}

ShardedOptimizer::ShardedOptimizer(optim::OptimizerOptions opts, std::size_t total, int replicas,
                                   Factory make)
    : make_(std::move(make)), total_(total), replicas_(replicas) {
  SINEW_ENFORCE(replicas >= 1, "--shard-replicas {}", replicas);
  if (!make_) {
    make_ = [o = std::move(opts)](Slice r, const optim::StatePlacement& place) {
      return optim::make_optimizer(o, r.count, place);
    };
  }
  const auto probe = make_(Slice{0, 0}, optim::StatePlacement{});
  name_ = probe->name();
  for (const auto& [name, buf] : probe->state()) names_.push_back(name);
}

std::vector<ShardedOptimizer::Held> ShardedOptimizer::make_held(
    int rank, int world, std::span<const optim::StatePlacement> place) const {
  const ShardLayout l(total_, world, replicas_);
  std::vector<Held> h;
  for (const int s : l.held_by(rank)) {
    const Slice r = l.shard(s);
    auto opt = make_(r, h.size() < place.size() ? place[h.size()] : optim::StatePlacement{});
    opt->set_steps(steps_);
    h.push_back({s, r, std::move(opt)});
  }
  return h;
}

void ShardedOptimizer::arrange(int rank, int world, std::span<float> params) {
  layout_ = ShardLayout(total_, world, replicas_);
  if (parameters_sharded_ && !params.empty()) {
    const Slice all{0, params.size()};
    release_except(params, std::span<const Slice>(&all, 1), layout_, rank);
    trim_heap();
  }
  held_ = make_held(rank, world);
  rank_ = rank;
  stale_ = false;
}

void ShardedOptimizer::set_steps(std::int64_t steps) {
  steps_ = steps;
  for (auto& h : held_) h.opt->set_steps(steps);
}

void ShardedOptimizer::step(std::span<float> params, std::span<const float> grads, float lr) {
  SINEW_ENFORCE(arranged(), "a sharded optimiser step before the shards were arranged");
  SINEW_ENFORCE(!state_given_back_, "a sharded optimiser step after its state was given back");
  SINEW_ENFORCE(params.size() == total_ && grads.size() == total_, "sharded step over {} of {} parameters",
                params.size(), total_);
  for (auto& h : held_) h.opt->step(h.range.of(params), h.range.of(grads), lr);
  ++steps_;
  last_lr_ = lr;
  stale_ = !parameters_sharded_;  // ZeRO-3: nothing to gather; the units gather what they run
}

void ShardedOptimizer::gather(comm::Backend& backend, std::span<float> params, const comm::Options& op) {
  SINEW_ENFORCE(backend.size() == layout_.world && backend.rank() == rank_,
                "gather over a view of {} as member {}, the shards are laid out over {} as {}",
                backend.size(), backend.rank(), layout_.world, rank_);
  std::vector<std::size_t> counts(static_cast<std::size_t>(layout_.world));
  for (int s = 0; s < layout_.world; ++s) counts[static_cast<std::size_t>(s)] = layout_.shard(s).count;
  backend.allgather_v(comm::Buffer::of(params), counts, op)->wait(op.timeout);
  const auto w = static_cast<std::uint64_t>(layout_.world);
  bytes_sent_ += w > 1 ? (w - 1) * total_ * sizeof(float) / w : 0;
  stale_ = false;
}

void ShardedOptimizer::gather_ranges(comm::Backend& backend, std::span<float> params,
                                     std::span<const Slice> ranges, const comm::Options& op) {
  SINEW_ENFORCE(
      arranged() && backend.size() == layout_.world && backend.rank() == rank_,
      "a gather of parameters over a view of {} as member {}, the shards are laid out over {} as {}",
      backend.size(), backend.rank(), layout_.world, rank_);
  std::vector<std::size_t> counts(static_cast<std::size_t>(layout_.world));
  std::uint64_t sent = 0;
  for (const Slice r : ranges) {
    if (r.count == 0) continue;
    for (int s = 0; s < layout_.world; ++s)
      counts[static_cast<std::size_t>(s)] = intersect(layout_.shard(s), r).count;
    backend.allgather_v(comm::Buffer::of(r.of(params)), counts, op)->wait(op.timeout);
    const auto w = static_cast<std::uint64_t>(layout_.world);
    sent += (w - 1) * r.count * sizeof(float) / w;
  }
  bytes_sent_ += sent;
}

void ShardedOptimizer::gather_rows(comm::Backend& backend, std::span<float> params, Slice table,
                                   std::size_t width, std::span<const std::int64_t> rows,
                                   const comm::Options& op) {
  SINEW_ENFORCE(arranged() && backend.size() == layout_.world && backend.rank() == rank_,
                "a gather of rows over a view of {} as member {}, the shards are laid out over {} as {}",
                backend.size(), backend.rank(), layout_.world, rank_);
  SINEW_ENFORCE(width > 0 && table.count % width == 0 && table.end() <= params.size(),
                "a gather of rows of {} elements from a table of {} at {}", width, table.count, table.offset);
  const auto n_rows = static_cast<std::int64_t>(table.count / width);
  for (std::size_t j = 0; j < rows.size(); ++j) {
    SINEW_ENFORCE(rows[j] >= 0 && rows[j] < n_rows && (j == 0 || rows[j] > rows[j - 1]),
                  "row {} of a gather: not sorted, distinct and in [0, {})", rows[j], n_rows);
  }
  const auto world = static_cast<std::size_t>(layout_.world);
  // Who asks for what: each member's count, then every member's rows.
  std::vector<std::int64_t> asked(world, 0);
  asked[static_cast<std::size_t>(rank_)] = static_cast<std::int64_t>(rows.size());
  backend.allreduce(comm::Buffer::of(std::span<std::int64_t>(asked)), comm::ReduceOp::kSum, op)
      ->wait(op.timeout);
  std::vector<std::size_t> counts(world);
  std::size_t total = 0, before = 0;
  for (std::size_t q = 0; q < world; ++q) {
    counts[q] = static_cast<std::size_t>(asked[q]);
    if (q == static_cast<std::size_t>(rank_)) before = total;
    total += counts[q];
  }
  std::vector<std::int64_t> all(total);
  std::copy(rows.begin(), rows.end(), all.begin() + static_cast<std::ptrdiff_t>(before));
  backend.allgather_v(comm::Buffer::of(std::span<std::int64_t>(all)), counts, op)->wait(op.timeout);
  // Each piece of a row (its part in one shard) comes from that shard's owner, unless the asker holds it.
  // Every member walks the same pieces in the same order: member q's rows, then the shards they cross.
  std::vector<std::vector<float>> out(world), in(world);
  std::vector<std::vector<Slice>> into(world);  // where each received piece goes, in order
  std::size_t at = 0;
  for (std::size_t q = 0; q < world; ++q) {
    const int asker = static_cast<int>(q);
    for (std::size_t j = 0; j < counts[q]; ++j, ++at) {
      const Slice row{table.offset + static_cast<std::size_t>(all[at]) * width, width};
      for (int s = layout_.shard_of(row.offset); s < layout_.world; ++s) {
        const Slice piece = intersect(layout_.shard(s), row);
        if (layout_.shard(s).offset >= row.end()) break;
        if (piece.count == 0 || sinew::train::holds(layout_, asker, s)) continue;
        if (s == rank_) {
          const auto src = piece.of(std::span<const float>(params));
          out[q].insert(out[q].end(), src.begin(), src.end());
        } else if (asker == rank_) {
          into[static_cast<std::size_t>(s)].push_back(piece);
        }
      }
    }
  }
  std::vector<comm::Backend::Message> sends, recvs;
  std::uint64_t sent = 0;
  for (std::size_t p = 0; p < world; ++p) {
    if (!out[p].empty()) {
      sends.push_back({comm::Buffer::of(std::span<float>(out[p])), static_cast<int>(p)});
      sent += out[p].size() * sizeof(float);
    }
    std::size_t n = 0;
    for (const Slice piece : into[p]) n += piece.count;
    if (n > 0) {
      in[p].resize(n);
      recvs.push_back({comm::Buffer::of(std::span<float>(in[p])), static_cast<int>(p)});
    }
  }
  if (auto w = backend.exchange(sends, recvs, op)) w->wait(op.timeout);
  for (std::size_t p = 0; p < world; ++p) {
    std::size_t from = 0;
    for (const Slice piece : into[p]) {
      std::copy_n(in[p].begin() + static_cast<std::ptrdiff_t>(from), piece.count, piece.of(params).begin());
      from += piece.count;
    }
  }
  bytes_sent_ += sent;
}

void ShardedOptimizer::release(std::span<float> buf, std::span<const Slice> ranges) const {
  if (!arranged()) {  // holds nothing
    for (const Slice r : ranges) release_pages(r.of(buf));
    return;
  }
  release_except(buf, ranges, layout_, rank_);
}

void ShardedOptimizer::release_except(std::span<float> buf, std::span<const Slice> ranges,
                                      const ShardLayout& layout, int rank) {
  std::vector<Slice> kept;
  for (const int s : layout.held_by(rank)) kept.push_back(layout.shard(s));
  std::sort(kept.begin(), kept.end(), [](Slice a, Slice b) { return a.offset < b.offset; });
  for (const Slice r : ranges) {
    std::size_t at = r.offset;
    for (const Slice k : kept) {
      if (k.end() <= at || k.count == 0) continue;
      if (k.offset >= r.end()) break;
      if (k.offset > at) release_pages(buf.subspan(at, k.offset - at));
      at = std::max(at, k.end());
    }
    if (at < r.end()) release_pages(buf.subspan(at, r.end() - at));
  }
}

bool ShardedOptimizer::holds(std::size_t e) const {
  return std::any_of(held_.begin(), held_.end(),
                     [e](const Held& h) { return e >= h.range.offset && e < h.range.end(); });
}

void ShardedOptimizer::scatter_bucket(comm::Backend& backend, std::span<float> bucket, std::size_t offset,
                                      const comm::Options& op, const algo::Quantization* quantized) {
  SINEW_ENFORCE(
      arranged() && backend.size() == layout_.world && backend.rank() == rank_,
      "a gradient reduce-scatter over a view of {} as member {}, the shards are laid out over {} as {}",
      backend.size(), backend.rank(), layout_.world, rank_);
  const Slice whole{offset, bucket.size()};
  const auto in_bucket = [&](int s) { return intersect(layout_.shard(s), whole); };
  const auto local = [&](Slice r) { return part_of(bucket, offset, r); };
  // In chunks of at most kScatterChunk elements: Open MPI's reduce-scatter allocates temporaries the size of
  // its input, which for a bucket of one large layer would add that layer's size to the peak (measured:
  // +134 MB per rank with a 64 MB layer, shard_bench.py).
  std::vector<std::size_t> counts(static_cast<std::size_t>(layout_.world));
  for (std::size_t at = 0; at < bucket.size(); at += kScatterChunk) {
    const Slice chunk{offset + at, std::min(kScatterChunk, bucket.size() - at)};
    for (int s = 0; s < layout_.world; ++s)
      counts[static_cast<std::size_t>(s)] = intersect(layout_.shard(s), chunk).count;
    if (quantized != nullptr) {
      std::span<float> res;
      if (!quantized->residual.empty()) res = quantized->residual.subspan(at, chunk.count);
      algo::CommStats stats;
      algo::compressed_reduce_scatter(
          backend, local(chunk), counts, [this](int s, int q) { return sinew::train::holds(layout_, q, s); },
          quantized->chunk, res, op, &stats, quantized->bits);
      bytes_sent_ += stats.bytes_sent;
      continue;
    }
    const Slice mine = intersect(layout_.shard(rank_), chunk);
    scatter_out_.resize(std::max(scatter_out_.size(), mine.count));
    const std::span<float> out(scatter_out_.data(), mine.count);
    backend
        .reduce_scatter(comm::Buffer::of(local(chunk)), comm::Buffer::of(out), counts, comm::ReduceOp::kSum,
                        op)
        ->wait(op.timeout);
    std::copy(out.begin(), out.end(), local(mine).begin());
  }
  if (quantized == nullptr) {
    if (auto w = send_to_replicas(backend, bucket, offset, op)) w->wait(op.timeout);
    const auto w = static_cast<std::uint64_t>(layout_.world);
    bytes_sent_ += (w - 1) * bucket.size() * sizeof(float) / w;
  }
  if (parameters_sharded_) {
    // ZeRO-3: what this member does not hold goes back to the system (it reads as zero).
    release(std::span<float>(bucket.data() - offset, offset + bucket.size()),
            std::span<const Slice>(&whole, 1));
    return;
  }
  // What this member does not hold is a partial sum: NaN, so that a read of it cannot pass unseen.
  for (int s = 0; s < layout_.world; ++s) {
    const Slice part = in_bucket(s);
    if (part.count > 0 && !holds(part.offset)) std::fill_n(local(part).begin(), part.count, kNotHeld);
  }
}

std::unique_ptr<comm::Work> ShardedOptimizer::send_to_replicas(comm::Backend& backend,
                                                               std::span<float> bucket, std::size_t offset,
                                                               const comm::Options& op) {
  // The shards' other holders: the owner's reduced part, point to point, all posted together (one NCCL group
  // on the GPU, where two holders that send each other their parts would otherwise deadlock).
  comm::Options o = op;
  o.tag = kTagScatter;
  const Slice whole{offset, bucket.size()};
  const auto local = [&](Slice r) { return part_of(bucket, offset, r); };
  std::vector<comm::Backend::Message> sends, recvs;
  if (const Slice own = intersect(layout_.shard(rank_), whole); own.count > 0) {
    for (const int h : layout_.holders(rank_)) {
      if (h == rank_) continue;
      sends.push_back({comm::Buffer::of(local(own)), h});
      bytes_sent_ += own.count * sizeof(float);
    }
  }
  for (const auto& h : held_) {
    const Slice part = intersect(h.range, whole);
    if (h.shard != rank_ && part.count > 0) recvs.push_back({comm::Buffer::of(local(part)), h.shard});
  }
  return backend.exchange(sends, recvs, o);
}

std::unique_ptr<comm::Work> ShardedOptimizer::scatter_bucket_device(comm::Backend& backend,
                                                                    std::span<float> bucket,
                                                                    std::size_t offset,
                                                                    const comm::Options& op) {
  SINEW_ENFORCE(
      arranged() && backend.size() == layout_.world && backend.rank() == rank_ && !parameters_sharded_,
      "a device gradient reduce-scatter over a view of {} as member {}, the shards are laid out over {} as "
      "{}",
      backend.size(), backend.rank(), layout_.world, rank_);
  const Slice whole{offset, bucket.size()};
  const auto local = [&](Slice r) { return part_of(bucket, offset, r); };
  std::vector<std::size_t> counts(static_cast<std::size_t>(layout_.world));
  for (int s = 0; s < layout_.world; ++s)
    counts[static_cast<std::size_t>(s)] = intersect(layout_.shard(s), whole).count;
  // Everything is enqueued in order on the backend's stream, nothing waited for here (the device bucketer
  // calls this on the compute thread): the reduce-scatter in place (this member's block of the bucket is its
  // own shard's part), the replicas' parts, then NaN over what this member does not hold (all bytes 0xff: a
  // NaN), so that a read of a partial sum shows.
  std::vector<std::unique_ptr<comm::Work>> works;
  const Slice mine = intersect(layout_.shard(rank_), whole);
  works.push_back(backend.reduce_scatter(comm::Buffer::of(bucket), comm::Buffer::of(local(mine)), counts,
                                         comm::ReduceOp::kSum, op));
  works.push_back(send_to_replicas(backend, bucket, offset, op));
  for (int s = 0; s < layout_.world; ++s) {
    const Slice part = intersect(layout_.shard(s), whole);
    if (part.count > 0 && !holds(part.offset))
      works.push_back(backend.fill(comm::Buffer::of(local(part)), 0xff));
  }
  const auto w = static_cast<std::uint64_t>(layout_.world);
  bytes_sent_ += (w - 1) * bucket.size() * sizeof(float) / w;
  return comm::all_of(std::move(works));
}

void ShardedOptimizer::discard() {
  held_.clear();
  rank_ = -1;
  stale_ = false;
}

std::vector<Slice> ShardedOptimizer::held_ranges() const {
  std::vector<Slice> r;
  r.reserve(held_.size());
  for (const auto& h : held_) r.push_back(h.range);
  return r;
}

void ShardedOptimizer::give_back_state() {
  for (auto& h : held_)
    for (const auto& [name, buf] : h.opt->state()) release_pages(buf);
  state_given_back_ = true;
}

NamedSpans ShardedOptimizer::own_state() {
  SINEW_ENFORCE(arranged(), "the shards' state before they were arranged");
  SINEW_ENFORCE(!state_given_back_, "the shards' state after it was given back (the end of training)");
  return held_.front().opt->state();
}

std::size_t ShardedOptimizer::state_bytes() const {
  std::size_t n = 0;
  for (const auto& h : held_) n += h.range.count;
  return n * names_.size() * sizeof(float);
}

double ShardedOptimizer::reshard(comm::Backend& backend, std::span<float> params, const comm::Options& op,
                                 int new_rank, int new_world) {
  if (state_given_back_) {
    SINEW_THROW(
        RelaunchRequest,
        "a change of membership after training ended: the optimiser state was given back once the end "
        "checkpoint held it, so there is nothing to reshard in place; the relaunch resumes from that "
        "checkpoint and finishes at once");
  }
  const auto t = Clock::now();
  const int m = backend.size(), q = backend.rank();
  SINEW_ENFORCE(params.size() == total_, "reshard of {} parameters, the shards cover {}", params.size(),
                total_);
  // Who held what: every member's rank and view size in the old layout (-1, 0: a newcomer), and its rank
  // in the new one.
  std::vector<std::int64_t> mine{rank_, arranged() ? layout_.world : 0, new_rank};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(m));
  backend.allgather_sync(comm::Buffer::of(std::span<std::int64_t>(mine)),
                         comm::Buffer::of(std::span<std::int64_t>(all)), op);
  std::vector<int> old_rank(static_cast<std::size_t>(m)), next_rank(static_cast<std::size_t>(m));
  int old_world = 0;
  for (std::size_t i = 0; i < old_rank.size(); ++i) {
    old_rank[i] = static_cast<int>(all[3 * i]);
    next_rank[i] = static_cast<int>(all[3 * i + 2]);
    const auto w = static_cast<int>(all[3 * i + 1]);
    if (w > 0 && old_world > 0 && w != old_world)
      SINEW_THROW(InternalError, "members laid out their shards over {} and {} ranks", old_world, w);
    old_world = std::max(old_world, w);
  }
  if (old_world == 0) SINEW_THROW(InternalError, "no member holds any shard of the optimiser state");
  const ShardLayout old(total_, old_world, replicas_);
  const ShardLayout next(total_, new_world, replicas_);
  const ReshardPlan plan = plan_reshard(old, old_rank, next_rank, next);
  if (plan.lost >= 0) {
    // Every holder of one shard is gone: its optimiser state exists nowhere in memory. The launcher
    // (sinew-run) relaunches from the newest checkpoint.
    const std::string why = fmt::format(
        "the optimiser state of shard {} of {} (elements {}..{}) was held by ranks {} of the failed view, "
        "all "
        "lost (--shard-replicas {})",
        plan.lost, old_world, old.shard(plan.lost).offset, old.shard(plan.lost).end(),
        fmt::join(old.holders(plan.lost), ", "), old.replicas);
    status::process().relaunch(status::Reason::kFailure, why);
    SINEW_THROW(RelaunchRequest, "{}; exiting for a relaunch from the newest checkpoint", why);
  }
  std::vector<std::unique_ptr<comm::Work>> works;
  if (parameters_sharded_) {
    // ZeRO-3: the new holders' parameters with their pieces, point to point, in place (a member never
    // receives into a range it provides), except where the new holder held that old shard already.
    comm::Options o = op;
    o.tag = kTagReshardParams;
    for (const auto& piece : plan.pieces) {
      if (piece.from == piece.to || (piece.to != q && piece.from != q)) continue;
      const int was = old_rank[static_cast<std::size_t>(piece.to)];
      if (was >= 0 && train::holds(old, was, old.shard_of(piece.range.offset))) continue;
      const auto buf = comm::Buffer::of(piece.range.of(params));
      works.push_back(piece.to == q ? backend.recv(buf, piece.from, o) : backend.send(buf, piece.to, o));
    }
  } else {
    // The parameters: each old shard's range from its source (a holder that applied its last update).
    for (int s = 0; s < old.world; ++s) {
      const Slice r = old.shard(s);
      if (r.count > 0)
        backend.broadcast_sync(comm::Buffer::of(r.of(params)), plan.source[static_cast<std::size_t>(s)], op);
    }
  }
  // The state: into buffers of the new layout made beside the old ones, which stay as they were until every
  // transfer is done, so that a failure meanwhile leaves them intact (the recovery starts again from them).
  const auto old_slot = [&](std::size_t e) -> Held& {  // the held old shard with element e
    for (auto& x : held_)
      if (e >= x.range.offset && e < x.range.end()) return x;
    SINEW_THROW(InternalError, "element {} of the optimiser state is not held here", e);
  };
  const auto part = [&](Held& h, std::size_t n, const ReshardPlan::Piece& piece) {
    return h.opt->state()[n].second.subspan(piece.range.offset - h.range.offset, piece.range.count);
  };
  std::vector<Held> fresh;
  if (new_rank >= 0) {
    // Memory taken fresh costs a page fault per page on its first write, which was most of a reshard's time
    // (a 100 M-parameter model's AdamW state, 578 MB per rank at 4 -> 3 ranks). So every new buffer is placed
    // to take the pages of the largest piece this member keeps from its old buffers: that piece lies at the
    // same offset within a page in both, and after the transfers its whole pages move (move_floats).
    std::vector<optim::StatePlacement> place;
    for (const int s : next.held_by(new_rank)) {
      const Slice want = next.shard(s);
      const ReshardPlan::Piece* kept = nullptr;
      for (const auto& piece : plan.pieces)
        if (piece.to == q && piece.from == q && piece.to_shard == s &&
            (kept == nullptr || piece.range.count > kept->range.count))
          kept = &piece;
      optim::StatePlacement p{.overwritten = true, .page_offset = {}};
      if (kept != nullptr) {
        Held& h = old_slot(kept->range.offset);
        for (std::size_t n = 0; n < names_.size(); ++n) {
          const auto at = reinterpret_cast<std::uintptr_t>(part(h, n, *kept).data());
          p.page_offset.push_back((at - (kept->range.offset - want.offset) * sizeof(float)) % page_bytes());
        }
      }
      place.push_back(std::move(p));
    }
    fresh = make_held(new_rank, new_world, place);
  }
  const auto slot = [&](int shard) -> Held& {
    for (auto& x : fresh)
      if (x.shard == shard) return x;
    SINEW_THROW(InternalError, "shard {} is not held here", shard);
  };
  for (std::size_t n = 0; n < names_.size(); ++n) {
    comm::Options o = op;
    o.tag = kTagReshard;
    for (const auto& piece : plan.pieces) {
      if (piece.to == q && piece.from != q) {
        works.push_back(backend.recv(comm::Buffer::of(part(slot(piece.to_shard), n, piece)), piece.from, o));
      } else if (piece.from == q && piece.to != q) {
        works.push_back(
            backend.send(comm::Buffer::of(part(old_slot(piece.range.offset), n, piece)), piece.to, o));
      }
    }
  }
  for (auto& w : works) w->wait(op.timeout);
  works.clear();
  // What this member keeps: only now, when nothing is sent from its old buffers any more.
  moved_bytes_ = 0;
  for (std::size_t n = 0; n < names_.size(); ++n)
    for (const auto& piece : plan.pieces)
      if (piece.to == q && piece.from == q)
        moved_bytes_ +=
            move_floats(part(old_slot(piece.range.offset), n, piece), part(slot(piece.to_shard), n, piece));
  held_ = std::move(fresh);
  layout_ = next;
  rank_ = new_rank;
  stale_ = false;
  if (parameters_sharded_) release_unheld(params);
  reshard_ms_ = seconds_since(t) * 1e3;
  return reshard_ms_;
}

std::unique_ptr<ShardedOptimizer> make_sharded_optimizer(const Config& c, workload::Workload& work) {
  if (c.shard == ShardStage::kNone) {
    SINEW_ENFORCE(work.has_optimizer(), "a workload without an optimiser, and --shard none");
    return nullptr;
  }
  if (work.has_optimizer()) {
    SINEW_THROW(InvalidArgument,
                "--shard {}: this workload ({}) keeps its optimiser's whole state itself; sharding it is not "
                "supported for it yet: use --shard none",
                name_of(kShardNames, c.shard), work.describe());
  }
  const optim::OptimizerOptions opts = optimizer_options(c);
  auto s = std::make_unique<ShardedOptimizer>(
      opts, work.params().size(), c.shard_replicas,
      [&work, opts](Slice r, const optim::StatePlacement& place) {
        auto own = work.shard_optimizer(r, place);  // the workload's kind (a torch.optim optimiser's), if any
        return own ? std::move(own) : optim::make_optimizer(opts, r.count, place);
      });
  if (c.shard == ShardStage::kParameters && !work.can_shard_parameters()) {
    SINEW_THROW(
        InvalidArgument,
        "--shard parameters: this workload ({}) cannot release and gather its parameters unit by unit; "
        "sharded parameters are for PyTorch models on the CPU (sinew.init(shard=\"parameters\")): "
        "use --shard gradients",
        work.describe());
  }
  s->set_gradients_sharded(c.shard == ShardStage::kGradients);
  s->set_parameters_sharded(c.shard == ShardStage::kParameters);
  if (c.shard == ShardStage::kParameters) work.shard_parameters();
  return s;
}

std::string describe(const ShardedOptimizer& s) {
  const auto mib = [](std::size_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
  const std::size_t whole = s.layout().total * s.names().size() * sizeof(float);
  return fmt::format(
      "optimiser state ({}){} sharded over {} ranks, each shard held by {}: {:.1f} MiB per rank of {:.1f} "
      "MiB",
      s.name(),
      s.parameters_sharded()  ? ", reduced gradients and parameters"
      : s.gradients_sharded() ? " and reduced gradients"
                              : "",
      s.layout().world, s.layout().replicas, mib(s.state_bytes()), mib(whole));
}

}  // namespace sinew::train
