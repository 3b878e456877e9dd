// Sharded optimiser state with in-memory redundancy (ZeRO stage 1, `--shard optimizer`), resharded in place
// after every change of membership.
//
// The flat parameter buffer of N elements is cut into one balanced, contiguous shard per member of the
// view (shard s = [N*s/W, N*(s+1)/W), the checkpoint writer's slices, so that a member writes exactly its
// own shard). Each shard's optimiser state is held by R members (--shard-replicas, R = min(R, W)): its
// owner s and R-1 members spread over the ring, s+k*(W/R) mod W (consecutive ranks, which launchers put on
// one node, hold different shards). Every holder applies the same
// deterministic update to the same reduced gradients (a ZeRO-1 step has every gradient on every member), so
// a replica stays current without a byte of state sent: it costs R/W of the optimiser state per member
// and R-fold the optimiser's arithmetic on 1/W of the model each, no bandwidth. The parameters stay whole on
// every member (ZeRO-1): after the update each owner's range is broadcast to the others (gather(), the
// session's last act of a step, so that anything the script runs between steps reads the whole model).
//
// After a failure the survivors agree on the most advanced step (a member whose reduction failed is one step
// behind; it is brought up to date with the reduced gradients of a member that completed it), take each old
// shard from its lowest surviving holder, and redistribute the state over the new view's layout: pieces
// move point to point from the survivor that holds them to the new holders, with redundancy R again. A
// shard whose R holders are all gone cannot be rebuilt: the job says which and exits for a relaunch from
// the newest checkpoint (never trains on a wrong state). A spawned replacement or a promoted spare holds
// nothing and receives its shards the same way; a growth or a planned leave is the same redistribution.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinew/algo/collectives.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/core/flat.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/train/config.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

/// Which members hold which part of a flat buffer of `total` elements over `world` members.
struct ShardLayout {
  std::size_t total = 0;
  int world = 1;
  int replicas = 1;  ///< holders per shard, min(--shard-replicas, world)

  ShardLayout() = default;
  ShardLayout(std::size_t total, int world, int replicas);
  /// Shard `s`'s elements: [total*s/world, total*(s+1)/world).
  [[nodiscard]] Slice shard(int s) const;
  /// The shard that element `e` (< total) is in (the last of them where empty shards share an offset).
  [[nodiscard]] int shard_of(std::size_t e) const;
  /// How far apart a shard's holders are: world / replicas, so that they are as far from each other as
  /// the ring allows (launchers place consecutive ranks on one node: a node's ranks then hold different
  /// shards, and the loss of a node loses none while it has fewer ranks than the stride).
  [[nodiscard]] int stride() const noexcept { return std::max(1, world / replicas); }
  /// The shards member `rank` holds, its own first: rank, rank-stride, ..., (mod world).
  [[nodiscard]] std::vector<int> held_by(int rank) const;
  /// The members that hold shard `s`, its owner first: s, s+stride, ..., s+(replicas-1)*stride (mod world).
  [[nodiscard]] std::vector<int> holders(int s) const;
};

/// How the state moves from an old layout to a new one (ShardedOptimizer::reshard's plan, a pure function
/// of who survived). "Members" are those of the communicator the reshard runs over: the new view after a
/// failure or a growth, the old one for a planned leave (the leaving members hand their shards over).
struct ReshardPlan {
  /// Per old shard: the member that provides it (the lowest surviving holder), or -1.
  std::vector<int> source;
  /// The first old shard none of whose holders survived (-1: none lost).
  int lost = -1;
  struct Piece {
    int from = 0, to = 0;  ///< members
    int to_shard = 0;      ///< the new shard it belongs to
    Slice range;           ///< elements of the flat buffer
  };
  /// Every piece of every new holder's shards, in one order that every member computes alike.
  std::vector<Piece> pieces;
};
/// Per member q: `old_rank[q]`, its rank in `old`, or -1 for a newcomer (a spawned replacement, a promoted
/// spare) that holds nothing; `new_rank[q]`, its rank in `next`, or -1 for a member that leaves.
[[nodiscard]] ReshardPlan plan_reshard(const ShardLayout& old, const std::vector<int>& old_rank,
                                       const std::vector<int>& new_rank, const ShardLayout& next);

/// This member's shards of the optimiser state, and the update over them.
class ShardedOptimizer {
 public:
  /// Makes the optimiser of one held range (its state that range's size).
  using Factory =
      std::function<std::unique_ptr<optim::Optimizer>(Slice range, const optim::StatePlacement& place)>;
  /// For a flat buffer of `total` parameters; holds nothing until arrange() or reshard(). `make` null:
  /// Sinew's optimiser of `opts` per range.
  ShardedOptimizer(optim::OptimizerOptions opts, std::size_t total, int replicas, Factory make = nullptr);

  /// A first launch: this member of `world` holds its shards, state zero (as a new optimiser's). With
  /// parameters_sharded(), `params` (the whole model until now) keeps only the held ranges in memory, given
  /// back before the state is made, so that the two never take memory together.
  void arrange(int rank, int world, std::span<float> params = {});
  [[nodiscard]] bool arranged() const noexcept { return rank_ >= 0; }
  [[nodiscard]] const ShardLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// The optimiser's name ("adam"; a script's torch.optim class, "AdamW").
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// The state buffers' names ("momentum"; "adam_m", "adam_v"), as the unsharded optimiser's.
  [[nodiscard]] const std::vector<std::string>& names() const noexcept { return names_; }

  /// The optimiser's step count (Adam's bias correction), the same on every held shard.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  void set_steps(std::int64_t steps);
  /// The update of every held shard's parameters from the (reduced) gradients with learning rate `lr`;
  /// the other ranges of `params` are stale until gather().
  void step(std::span<float> params, std::span<const float> grads, float lr);
  /// The learning rate of the last step() (a member one step behind repeats that step with it).
  [[nodiscard]] float last_lr() const noexcept { return last_lr_; }
  /// Whether ranges of the parameters are stale (a step since the last gather()).
  [[nodiscard]] bool stale() const noexcept { return stale_; }
  /// Collective: an all-gather of every shard's range from its owner, so that every member holds the
  /// whole model.
  void gather(comm::Backend& backend, std::span<float> params, const comm::Options& op);

  /// --shard gradients (ZeRO-2), collective, instead of the allreduce of one gradient bucket: `bucket` is
  /// the range of the gradients at `offset`. Reduce-scatter of the bucket over the shards' owners, then each
  /// owner sends its reduced part to the shard's other holders, so that every member ends with the summed
  /// gradients of the shards it holds (all it steps) and with NaN in the rest of the bucket: a read of a
  /// gradient this member does not hold shows, instead of passing a partial sum for the reduced one.
  /// Runs on the bucketer's communication thread; waits bounded by op.timeout. With `quantized` (ByteGrad),
  /// the reduce-scatter and the owners' parts to the other holders are its quantised exchange
  /// (algo::compressed_reduce_scatter): every holder of a shard decodes the same bytes, so its replicas
  /// stay bitwise equal.
  void scatter_bucket(comm::Backend& backend, std::span<float> bucket, std::size_t offset,
                      const comm::Options& op, const algo::Quantization* quantized = nullptr);
  /// The same for gradients in device memory (--device cuda), over the NCCL backend: the reduce-scatter runs
  /// in place, the owners' parts go to the other holders in one NCCL group, and the ranges this member does
  /// not hold are set to NaN on the device. Enqueues it all on the backend's stream and returns without
  /// waiting: the Work completes with the last of it (the device bucketer's reduction of one bucket). Not
  /// with sharded parameters, nor quantised (refused by the options).
  std::unique_ptr<comm::Work> scatter_bucket_device(comm::Backend& backend, std::span<float> bucket,
                                                    std::size_t offset, const comm::Options& op);
  /// Whether element `e` of the flat buffer is in a shard this member holds.
  [[nodiscard]] bool holds(std::size_t e) const;

  /// Bytes this member sent for gather() and scatter_bucket() since the last call, counted as the
  /// bandwidth-optimal collectives send them (an all-gather or a reduce-scatter: (W-1)/W of the buffer),
  /// as the metrics count the allreduce, plus the replicas' point-to-point parts.
  [[nodiscard]] std::uint64_t take_bytes_sent() noexcept { return bytes_sent_.exchange(0); }

  /// Gives up this member's shards (it holds nothing afterwards, as a newcomer): a ZeRO-2 member one step
  /// behind, whose reduced gradients of the failed step are gone, takes its shards from holders that
  /// completed the step (reshard()).
  void discard();

  /// --shard gradients: the gradients are reduce-scattered (scatter_bucket), so a member holds only the
  /// reduced gradients of its shards.
  [[nodiscard]] bool gradients_sharded() const noexcept { return gradients_sharded_; }
  void set_gradients_sharded(bool on) noexcept { gradients_sharded_ = on; }

  /// --shard parameters (ZeRO-3): the gradients are sharded as above and so are the parameters. A member's
  /// flat buffers keep their addresses and size, but only the ranges of its held shards are in memory: the
  /// rest of the parameters is gathered unit by unit when a forward or backward needs it (gather_ranges)
  /// and released after (release), the rest of each reduced gradient bucket is released instead of set to
  /// NaN, and a reshard sends the new holders their parameters with their state (no whole-model
  /// broadcast). Implies gradients_sharded().
  [[nodiscard]] bool parameters_sharded() const noexcept { return parameters_sharded_; }
  void set_parameters_sharded(bool on) noexcept {
    parameters_sharded_ = on;
    if (on) gradients_sharded_ = true;
  }
  /// Collective, the same `ranges` in the same order on every member: each range's elements from the
  /// owners of the shards it crosses (an all-gather of uneven blocks per range), into `params`.
  void gather_ranges(comm::Backend& backend, std::span<float> params, std::span<const Slice> ranges,
                     const comm::Options& op);
  /// Collective, an embedding's forward: of `table` (a range of `params`, rows of `width` elements) only the
  /// rows each member names, each row's pieces from the owners of the shards they cross, point to point
  /// (pieces a member holds itself are not sent). `rows`: this member's, sorted and distinct; they differ
  /// between members and are shared first (an all-gather). The rest of the table is left as it is.
  void gather_rows(comm::Backend& backend, std::span<float> params, Slice table, std::size_t width,
                   std::span<const std::int64_t> rows, const comm::Options& op);
  /// Gives the memory of the parts of `ranges` of `buf` (a flat buffer of map_pages(), core/pages.hpp) that
  /// this member does not hold back to the system; they read as zero until written again. Whole pages
  /// only: those a held range shares keep their memory. Local.
  void release(std::span<float> buf, std::span<const Slice> ranges) const;
  /// The same over the whole buffer.
  void release_unheld(std::span<float> buf) const {
    const Slice all{0, buf.size()};
    release(buf, std::span<const Slice>(&all, 1));
  }

  /// The ranges of the flat buffer this member holds, owner's shard first.
  [[nodiscard]] std::vector<Slice> held_ranges() const;

  /// At the end of training, once the end checkpoint holds it: gives the memory of every held shard's
  /// optimiser state back to the system (its whole pages; they read as zero). Nothing may read the state
  /// afterwards: step(), own_state() and reshard() refuse it, the last with RelaunchRequest (a failure after
  /// the end checkpoint ends in a relaunch from it, which finishes at once). Local.
  void give_back_state();
  [[nodiscard]] bool state_given_back() const noexcept { return state_given_back_; }

  /// The held shards with their state, owner's shard first.
  struct Held {
    int shard = 0;
    Slice range;
    std::unique_ptr<optim::Optimizer> opt;  ///< its state(): the state of `range`
  };
  [[nodiscard]] const std::vector<Held>& held() const noexcept { return held_; }
  /// The state of this member's own shard by name: what it writes into a checkpoint.
  [[nodiscard]] NamedSpans own_state();
  /// Bytes of optimiser state this member holds.
  [[nodiscard]] std::size_t state_bytes() const;

  /// Collective over `backend`, for a change of membership: the parameters whole and equal on every member
  /// (each old shard's range from its lowest surviving holder) and the state redistributed over the new
  /// layout of `new_world` members, in which this member is `new_rank` (plan_reshard()). After a failure or
  /// a growth `backend` is the new view (new_rank its rank); for a planned leave it is the old view, and a
  /// leaving member passes -1 and afterwards holds nothing. A member that holds nothing yet (arranged()
  /// false) receives its shards. Throws RelaunchRequest naming the shard and its holders when a shard was
  /// lost, CommFailure if a member fails meanwhile (this member's shards are then unchanged, so that the
  /// recovery can start again). Returns the milliseconds spent.
  double reshard(comm::Backend& backend, std::span<float> params, const comm::Options& op, int new_rank,
                 int new_world);
  /// Milliseconds the last reshard() took on this member (0 before any).
  [[nodiscard]] double last_reshard_ms() const noexcept { return reshard_ms_; }
  /// Bytes of state the last reshard() moved as whole pages from this member's old buffers into its new
  /// ones, instead of copying them into memory taken fresh (core/pages.hpp move_floats).
  [[nodiscard]] std::size_t last_moved_bytes() const noexcept { return moved_bytes_; }

 private:
  /// The shards `rank` holds in a layout over `world`, with fresh state made as `place` says (per shard, in
  /// held_by()'s order; empty: initialised).
  std::vector<Held> make_held(int rank, int world, std::span<const optim::StatePlacement> place = {}) const;
  /// release() with the shards of `rank` in `layout` as the held ones.
  static void release_except(std::span<float> buf, std::span<const Slice> ranges, const ShardLayout& layout,
                             int rank);
  /// scatter_bucket's second half: each owner's reduced part of `bucket` to its shard's other holders, all
  /// posted at once (null: nothing to send or receive).
  std::unique_ptr<comm::Work> send_to_replicas(comm::Backend& backend, std::span<float> bucket,
                                               std::size_t offset, const comm::Options& op);

  Factory make_;
  std::size_t total_;
  int replicas_;
  std::string name_;
  std::vector<std::string> names_;
  ShardLayout layout_;
  int rank_ = -1;
  std::vector<Held> held_;
  std::int64_t steps_ = 0;
  float last_lr_ = 0;
  bool stale_ = false;
  bool gradients_sharded_ = false;
  bool parameters_sharded_ = false;
  bool state_given_back_ = false;
  std::atomic<std::uint64_t> bytes_sent_{0};  // added to by the communication thread (scatter_bucket)
  std::vector<float> scatter_out_;            // scatter_bucket's reduce-scatter output
  double reshard_ms_ = 0;
  std::size_t moved_bytes_ = 0;  // last_moved_bytes()
};

/// --shard: this member's sharded optimiser for `work`, or null with --shard none. Throws InvalidArgument
/// for a workload that keeps its optimiser's whole state itself (it was not built for sharding).
[[nodiscard]] std::unique_ptr<ShardedOptimizer> make_sharded_optimizer(const Config& c,
                                                                       workload::Workload& work);
/// "optimiser state sharded over 4 ranks, each shard held by 2: 1.2 MiB per rank of 2.5 MiB", for the log.
[[nodiscard]] std::string describe(const ShardedOptimizer& s);

}  // namespace sinew::train
