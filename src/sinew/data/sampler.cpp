#include "sinew/data/sampler.hpp"

#include <algorithm>
#include <numeric>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"

namespace sinew::data {

namespace {

void check_step_args(int world_size, std::size_t per_rank_batch) {
  if (world_size < 1) SINEW_THROW(InvalidArgument, "sampler: world size must be >= 1, got {}", world_size);
  if (per_rank_batch == 0) SINEW_THROW(InvalidArgument, "sampler: per-rank batch size must be >= 1");
}

}  // namespace

DistributedSampler::DistributedSampler(std::size_t dataset_size, std::uint64_t seed, bool shuffle)
    : seed_(seed), shuffle_(shuffle), perm_(dataset_size) {
  if (dataset_size == 0) SINEW_THROW(InvalidArgument, "sampler: the data set is empty");
  build_permutation();
}

void DistributedSampler::build_permutation() {
  std::iota(perm_.begin(), perm_.end(), std::size_t{0});
  if (!shuffle_) return;
  // Fisher-Yates with the portable Rng (std::shuffle's algorithm is implementation-defined), seeded from
  // (seed, epoch) so every rank, and every restart, builds the same permutation for the same epoch.
  Rng rng(Rng::mix(seed_, static_cast<std::uint64_t>(epoch_)));
  for (std::size_t i = perm_.size() - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(rng.uniform_below(i + 1));
    std::swap(perm_[i], perm_[j]);
  }
}

DistributedSampler::Batch DistributedSampler::peek(int rank, int world_size,
                                                   std::size_t per_rank_batch) const {
  check_step_args(world_size, per_rank_batch);
  const auto w = static_cast<std::size_t>(world_size);
  const std::size_t remaining = perm_.size() - cursor_;
  const std::size_t global = per_rank_batch > remaining / w ? remaining : w * per_rank_batch;  // no overflow
  return peek_range(rank, world_size, 0, global);
}

DistributedSampler::Batch DistributedSampler::peek_range(int rank, int world_size, std::size_t offset,
                                                         std::size_t global) const {
  if (world_size <= 0) SINEW_THROW(InvalidArgument, "sampler: world size must be > 0, got {}", world_size);
  if (rank < 0 || rank >= world_size)
    SINEW_THROW(InvalidArgument, "sampler: rank {} out of range for world size {}", rank, world_size);
  if (offset > perm_.size() - cursor_ || global > perm_.size() - cursor_ - offset) {
    SINEW_THROW(InvalidArgument,
                "sampler: samples [{}, {}) past the cursor are beyond epoch {}'s end ({} left)", offset,
                offset + global, epoch_, perm_.size() - cursor_);
  }
  const auto w = static_cast<std::size_t>(world_size);
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t base = global / w;
  const std::size_t extra = global % w;
  const std::size_t start = cursor_ + offset + r * base + std::min(r, extra);
  const std::size_t count = base + (r < extra ? 1 : 0);
  Batch batch;
  batch.global_count = global;
  batch.indices.assign(perm_.begin() + static_cast<std::ptrdiff_t>(start),
                       perm_.begin() + static_cast<std::ptrdiff_t>(start + count));
  return batch;
}

void DistributedSampler::advance(std::size_t global_count) {
  if (global_count > perm_.size() - cursor_)
    SINEW_THROW(InvalidArgument, "sampler: cannot advance by {} samples, only {} of epoch {} are left",
                global_count, perm_.size() - cursor_, epoch_);
  cursor_ += global_count;
}

void DistributedSampler::start_epoch(std::int64_t epoch) {
  if (epoch < 0) SINEW_THROW(InvalidArgument, "sampler: epoch must be >= 0, got {}", epoch);
  if (epoch != epoch_) {
    epoch_ = epoch;
    build_permutation();
  }
  cursor_ = 0;
}

void DistributedSampler::set_position(std::int64_t epoch, std::size_t cursor) {
  if (cursor > perm_.size())
    SINEW_THROW(InvalidArgument, "sampler: cursor {} is past the end of the {}-sample data set", cursor,
                perm_.size());
  start_epoch(epoch);
  cursor_ = cursor;
}

std::size_t DistributedSampler::steps_left(int world_size, std::size_t per_rank_batch) const {
  check_step_args(world_size, per_rank_batch);
  const std::size_t remaining = perm_.size() - cursor_;
  const auto w = static_cast<std::size_t>(world_size);
  if (per_rank_batch > remaining / w) return remaining == 0 ? 0 : 1;  // one (last) step takes all
  const std::size_t global = w * per_rank_batch;
  return (remaining + global - 1) / global;
}

}  // namespace sinew::data
