// The elastic distributed sampler: which samples each rank trains on, step by step.
//
// Every epoch walks a seeded permutation of [0, n). The position in it, (epoch, cursor), counts samples
// consumed by the whole group, never per rank, so it means the same thing for any world size: the group
// can shrink or grow between two steps (or be restored from a checkpoint at another size) and every sample
// of the epoch is still seen exactly once.
//
// A step of world size W and per-rank batch b takes the next G = min(W * b, remaining) samples of the
// permutation and deals them out in rank order, as evenly as possible: rank r gets G / W samples, plus one
// when r < G % W. Hence all ranks get b except in the epoch's last step, a rank may get 0 there, and the
// ranks' slices concatenated in rank order are exactly the single-rank step with batch W * b -- which is
// what makes W ranks x b samples equal 1 rank x W*b samples.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace sinew::data {

class DistributedSampler {
 public:
  /// Starts at epoch 0, cursor 0. shuffle = false walks the samples in order (identity permutation).
  /// Throws InvalidArgument when dataset_size == 0.
  DistributedSampler(std::size_t dataset_size, std::uint64_t seed, bool shuffle = true);

  struct Batch {
    std::vector<std::size_t> indices;  ///< this rank's samples, in permutation order
    std::size_t global_count = 0;      ///< samples in the whole step (all ranks), to pass to advance()
  };

  /// This rank's samples of the next step; does not advance. Every rank calls it with the same world size
  /// and batch, then advance(global_count). Empty (global_count 0) when the epoch is done.
  /// Throws InvalidArgument unless 0 <= rank < world_size and per_rank_batch > 0.
  [[nodiscard]] Batch peek(int rank, int world_size, std::size_t per_rank_batch) const;

  /// The `global` samples that follow the cursor after skipping `offset`, dealt out over `world_size`
  /// ranks as peek() does; does not advance. Gradient accumulation takes a step as several such ranges.
  /// Throws InvalidArgument for a bad rank or a range past the epoch's end.
  [[nodiscard]] Batch peek_range(int rank, int world_size, std::size_t offset, std::size_t global) const;

  /// Marks global_count more samples of this epoch consumed; throws InvalidArgument past the epoch's end.
  void advance(std::size_t global_count);

  [[nodiscard]] bool epoch_done() const noexcept { return cursor_ == perm_.size(); }

  /// Switches to `epoch` (>= 0, else InvalidArgument): a fresh permutation, cursor 0.
  void start_epoch(std::int64_t epoch);

  [[nodiscard]] std::int64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] std::size_t cursor() const noexcept { return cursor_; }
  [[nodiscard]] std::size_t dataset_size() const noexcept { return perm_.size(); }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  [[nodiscard]] bool shuffle() const noexcept { return shuffle_; }

  /// Restores a saved position (e.g. from a checkpoint); throws InvalidArgument unless epoch >= 0 and
  /// cursor <= dataset_size().
  void set_position(std::int64_t epoch, std::size_t cursor);

  /// Steps left in this epoch at this world size and batch: ceil(remaining / (world_size * per_rank_batch)).
  [[nodiscard]] std::size_t steps_left(int world_size, std::size_t per_rank_batch) const;

  /// The current epoch's permutation of [0, dataset_size()).
  [[nodiscard]] std::span<const std::size_t> permutation() const noexcept { return perm_; }

 private:
  void build_permutation();

  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t epoch_ = 0;
  std::size_t cursor_ = 0;
  std::vector<std::size_t> perm_;
};

}  // namespace sinew::data
