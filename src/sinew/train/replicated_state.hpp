// The replicated training state, listed once.
//
// Every member of the group holds the same parameters, optimiser state and training position (data
// parallelism). The scalars of that position live in one trivially copyable struct, Position; the tensors
// are listed by TrainState::tensors(). Everything that moves the state derives from these two lists:
//   snapshot_ref() -> a checkpoint::StateRef (checkpoints; load() reads one back)
//   load()         <- a checkpoint, read straight into the tensors (resume, at any world size)
//   synchronise()  every member takes the state of the most advanced one (after a change of membership)
// so adding a field means adding it to Position (and, if a checkpoint must carry it, to snapshot_ref/load).
// The tensors are the workload's (workload/workload.hpp): its parameters and its optimiser's named state.
// A workload that trains on a GPU is asked to copy them to the host before these three read them and back
// after they wrote them (Workload::to_host/to_device).
//
// (Not to be confused with checkpoint::TrainingState, a checkpoint's contents as read from a file.)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "sinew/checkpoint/reader.hpp"
#include "sinew/checkpoint/state.hpp"
#include "sinew/comm/backend.hpp"
#include "sinew/train/position.hpp"

namespace sinew::algo {
class Algorithm;
}
namespace sinew::data {
class DistributedSampler;
}
namespace sinew::workload {
class Workload;
}

namespace sinew::train {

class ShardedOptimizer;
class StateMirror;

/// The state of one member: the Position plus the workload's and sampler's own state, which it reads and
/// writes through references (they stay the owners).
class ReplicatedState {
 public:
  ReplicatedState(workload::Workload& work, data::DistributedSampler& sampler, std::uint64_t seed);
  ReplicatedState(const ReplicatedState&) = delete;
  ReplicatedState& operator=(const ReplicatedState&) = delete;
  ReplicatedState(ReplicatedState&&) = delete;
  ReplicatedState& operator=(ReplicatedState&&) = delete;
  ~ReplicatedState();

  /// The position, with the sampler's and optimiser's counters brought up to date.
  [[nodiscard]] const Position& position();
  /// Mutable access for the collaborators that own parts of it (loop, lr rescaler, control).
  [[nodiscard]] Position& pos() noexcept { return pos_; }
  [[nodiscard]] const Position& pos() const noexcept { return pos_; }

  /// The replicated tensors by checkpoint name: "params", then "optim/<name>" for the optimiser state.
  [[nodiscard]] std::vector<std::pair<std::string, std::span<float>>> tensors();

  /// The state as a checkpoint writer takes it, without a copy: references into the workload and
  /// `algorithm` (its per-rank state as this rank's block of `world`: rank r's shard holds
  /// exactly its block, docs/checkpoint-format.md), valid until the next step; with the model's
  /// per-layer views and description. The writer copies what it needs before save()/save_async() return.
  [[nodiscard]] checkpoint::StateRef snapshot_ref(algo::Algorithm& algorithm, int world,
                                                  std::string config_json);

  /// Loads the checkpoint at `path` into this state after checking that it fits this run (data set size,
  /// seed, tensor sizes); throws CheckpointError naming `path` and the mismatch otherwise. The tensors are
  /// read straight into the model and the optimiser, each byte once and checked (checkpoint::load_into);
  /// on an error they may hold part of the checkpoint. Per-rank algorithm state: this rank's block at the
  /// same world size, else the blocks' mean. Refuses a checkpoint whose per-tensor views do not match the
  /// workload's (another model of the same size). Sets step, epoch, cursor, optimiser steps, and
  /// last_eval_epoch = epoch - 1 (a checkpoint at an epoch's end may precede that epoch's evaluation).
  /// Returns the manifest.
  checkpoint::ManifestInfo load(const std::string& path, algo::Algorithm& algorithm, int rank, int world);

  /// Collective over `backend`, after any change of membership: every member takes the state of the
  /// most advanced one (the lowest rank among those at the highest step: with a lockstep algorithm a step
  /// that completed anywhere completed with every rank's gradients), from memory, then all check that
  /// they hold the same bytes (InternalError otherwise). Returns milliseconds. A member that has no state
  /// yet (a spawned replacement, a promoted spare) calls it with step -1. `rewind`: every member first
  /// goes back to its mark_agreed() state (after a failure, for the algorithms whose ranks step on their
  /// own, algo::Algorithm::lockstep()), and the tensors are then the average over the rewound members
  /// instead of one member's.
  double synchronise(comm::Backend& backend, const comm::Options& op, bool rewind = false);

  /// For the algorithms whose ranks complete steps on their own: remembers this member's state as of a
  /// step that every member is known to have completed (just after a collective over all of them, the
  /// step-boundary agreement). After a failure the survivors rewind to it: a survivor that got further
  /// did so without the lost rank, and the lost rank may have been behind everyone; from the agreed step
  /// every member's batches were trained (the exactly-once audit). Costs a copy of the parameters and
  /// optimiser state per agreement (every 10 steps).
  void mark_agreed();
  /// A first launch (collective): checks that every member trains rank 0's model (its tensors' names and
  /// shapes; InvalidArgument naming the first that differs), then makes rank 0's parameters and buffers
  /// everyone's, as DDP does at construction.
  void take_rank0(comm::Backend& backend, const comm::Options& op);

  /// `--shard optimizer`: the optimiser's state lives in `shards` (train/shards.hpp; not owned), each member
  /// holding its shards of it, instead of whole in the workload. From then on checkpoints take each member's
  /// own shard, load() reads the held shards, and synchronise() reshards over the new view.
  void attach_shards(ShardedOptimizer* shards) noexcept { shards_ = shards; }
  /// With shards: the milliseconds of the last synchronise() spent rebuilding and moving them; else -1.
  [[nodiscard]] double reshard_ms() const;
  /// With shards: the bytes of state the last reshard moved (whole pages) instead of copying; else 0.
  [[nodiscard]] std::size_t reshard_moved_bytes() const;

  /// Collective over the view before the members marked in `leaving` (by rank) leave it: with sharded
  /// state, the staying members take the whole of it over, laid out over them (a leave loses nothing
  /// whatever the redundancy). Nothing without shards.
  void hand_over(comm::Backend& backend, const comm::Options& op, const std::vector<bool>& leaving);

  /// From now on the state is mirrored into node-local memory, DIR/state-HOST.bin (state_mirror.hpp), by the
  /// processes set as writers (one per node). Not for a workload on a GPU.
  /// Returns why not, for the log, where the state cannot be mirrored (then it is not): a sharded state, a
  /// workload on a GPU, state beside the tensors.
  std::string attach_mirror(const std::string& dir);
  [[nodiscard]] bool mirrored() const noexcept { return mirror_ != nullptr; }
  /// Whether this process writes its node's mirror (the view's lowest rank on the node).
  void set_mirror_writer(bool writer) noexcept { mirror_writer_ = writer; }
  /// Once every member holds this state, the group's one model at a step it will not undo (after a lockstep
  /// step; with the algorithms whose ranks step on their own, after a consensus: at an agreement their
  /// models still differ, and one rank's model is not the group's): the state into the mirror, on a writer.
  void mirror();
  /// If the node's mirror holds a state newer than this one (a relaunch after a failure): loads its tensors
  /// and position (the fields a checkpoint sets, see load()) and returns its step.
  std::optional<std::int64_t> load_mirror();
  /// Training is over: the mirror's file goes.
  void drop_mirror();
  [[nodiscard]] std::string mirror_path() const;

 private:
  void restore(const Position& p);
  /// synchronise()'s part for sharded optimiser state (attach_shards()).
  void reshard(comm::Backend& backend, const comm::Options& op, int root, std::int64_t own_step,
               std::int64_t top, const Position& root_pos);

  workload::Workload& work_;
  data::DistributedSampler& sampler_;
  std::uint64_t seed_;
  Position pos_;
  std::optional<Position> agreed_pos_;  // mark_agreed()
  std::vector<std::vector<float>> agreed_;
  ShardedOptimizer* shards_ = nullptr;
  std::unique_ptr<StateMirror> mirror_;
  bool mirror_writer_ = false;
};

}  // namespace sinew::train
