// The newest training state, kept in node-local shared memory (--state-mirror DIR, e.g. /dev/shm/...), so
// that a relaunch takes up training at the step where the job failed rather than at its last checkpoint.
//
// A job that cannot recover in place ends: its processes leave at a repair deadline (membership/
// repair_watch.hpp) or are killed with their launcher. What they held in memory dies with them; a file in
// a tmpfs does not: it outlives every process of a node that itself survives. So after every completed step
// (with the algorithms whose ranks step on their own: at every step-boundary agreement, the state they
// rewind to) one process per node, the view's lowest rank there, copies the replicated state (parameters,
// optimiser state, model buffers, the training position) into DIR/state-HOST.bin (HOST: the node's
// hostname, so that nodes sharing a directory, such as the test bed's hosts on one kernel, keep apart). A
// relaunch (--resume auto) reads its own node's copy on every node, and the members then take the state of
// the most advanced one, exactly as after an in-place recovery (ReplicatedState::synchronise).
//
// The file holds two slots, written alternately, each with a sequence number: odd while the slot is being
// written, even once it is complete (a seqlock). A process that dies in the middle of a copy leaves that
// slot odd, and a reader takes the other one, one step older: a torn copy is never loaded. A copy is loaded
// only into a state of the same layout (tensor names and sizes, data set size and seed: a hash in the
// file's header).
//
// Cost: one copy of the state per step on one process per node, as fast as a memcpy (sinew-bench
// state-mirror: 0.09 ms for the MLP's parameters and momentum, 4.5 ms for ResNet-18's 89.5 MB), and twice the
// state's size in the node's memory. Workloads on a GPU are not
// mirrored (a copy to the host per step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "sinew/core/flat.hpp"
#include "sinew/train/position.hpp"

namespace sinew::train {

class StateMirror {
 public:
  /// The mirror in `dir` (its file DIR/state-HOST.bin) of states of layout `layout` (layout_hash()).
  StateMirror(std::string dir, std::uint64_t layout);
  StateMirror(const StateMirror&) = delete;
  StateMirror& operator=(const StateMirror&) = delete;
  StateMirror(StateMirror&&) = delete;
  StateMirror& operator=(StateMirror&&) = delete;
  ~StateMirror();

  /// The layout key of a state: its tensors' names and sizes, the data set's size and the seed.
  [[nodiscard]] static std::uint64_t layout_hash(const NamedSpans& tensors, std::size_t dataset_size,
                                                 std::uint64_t seed);

  /// Copies `p` and `tensors` into the older slot. The file is made (and its space reserved) on the first
  /// call; if that fails (no space in the tmpfs, no such directory) the mirror warns once and writes
  /// nothing from then on (returns false): training goes on, a relaunch then starts from the checkpoint.
  bool write(const Position& p, const NamedSpans& tensors);

  /// The step of the newest complete copy in the file, if it has one of this layout (also when an earlier
  /// process wrote it).
  [[nodiscard]] std::optional<std::int64_t> newest() const;

  /// Reads the newest complete copy into `p` and `tensors` (which must have the layout's sizes). False if
  /// there is none, or it changed while being read.
  bool read(Position& p, const NamedSpans& tensors) const;

  /// Removes the file (training is over).
  void remove();

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  bool map(std::size_t slot_bytes);

  std::string dir_;
  std::string path_;
  std::uint64_t layout_;
  int fd_ = -1;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  std::size_t slot_bytes_ = 0;
  bool failed_ = false;
};

}  // namespace sinew::train
