#include "sinew/algo/collectives.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sinew/algo/quantize.hpp"
#include "sinew/comm/ring/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::algo {
namespace {

using comm::ring::Block;
using comm::ring::block_of;

using Works = std::vector<std::unique_ptr<comm::Work>>;

/// One deadline for a whole call, however many operations it waits for: the caller's timeout bounds the
/// allreduce, as it bounds the backend's own allreduce.
class Deadline {
 public:
  Deadline(std::string what, std::chrono::milliseconds timeout)
      : what_(std::move(what)), timeout_(timeout), end_(Clock::now() + timeout) {}

  void wait(comm::Work& w) const {
    // Rounded up, so that the call never gives up before its timeout.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(end_ - Clock::now());
    try {
      w.wait(std::max(left, std::chrono::milliseconds{0}));
    } catch (const Timeout& e) {
      // The backend's message gives the time left, not the call's timeout: say which call missed it.
      SINEW_THROW(Timeout, "{} did not complete within {} ms ({})", what_, timeout_.count(), e.message());
    }
  }
  void wait_all(Works& works) const {
    for (auto& w : works) wait(*w);
  }

 private:
  std::string what_;
  std::chrono::milliseconds timeout_;
  Clock::time_point end_;
};

void count_send(CommStats* stats, std::size_t bytes) {
  if (stats == nullptr) return;
  stats->bytes_sent += bytes;
  ++stats->messages_sent;
}

int wrap(int i, int n) { return ((i % n) + n) % n; }

/// The reduction both calls share. Block k of `data` (`blocks[k]`, contiguous, in rank order) is reduced
/// by rank k; `gets(k, q)` says whether rank q (q != k) receives the reduced block k.
void compressed_reduce(comm::Backend& backend, std::span<float> data, std::span<const Block> blocks,
                       const std::function<bool(int, int)>& gets, std::size_t chunk,
                       std::span<float> residual, const comm::Options& opts, CommStats* stats, int bits,
                       const char* what) {
  if (chunk == 0) SINEW_THROW(InvalidArgument, "{}: the chunk size must be at least 1", what);
  (void)encoded_bytes(0, chunk, bits);  // bits and chunk's alignment, at every rank alike
  if (!residual.empty() && residual.size() != data.size()) {
    SINEW_THROW(InvalidArgument,
                "{}: the residual has {} elements, the data {}; pass an empty residual to turn error "
                "feedback off",
                what, residual.size(), data.size());
  }
  const int n = backend.size(), r = backend.rank();
  const std::size_t count = data.size();
  if (n == 1 || count == 0) return;
  const Deadline deadline(fmt::format("{} of {} floats", what, count), opts.timeout);
  const bool feedback = !residual.empty();
  if (feedback) {
    for (std::size_t i = 0; i < count; ++i) data[i] += residual[i];
  }
  const auto block = [&](int k) { return blocks[static_cast<std::size_t>(k)]; };

  // `wire` holds block k's encoding at wire_at[k]: first this rank's contribution for rank k, later the
  // reduced block k received from rank k; at k == r, the reduced block this rank owns.
  std::vector<std::size_t> wire_at(static_cast<std::size_t>(n) + 1, 0);
  for (int k = 0; k < n; ++k) {
    const auto ku = static_cast<std::size_t>(k);
    wire_at[ku + 1] = wire_at[ku] + encoded_bytes(block(k).count, chunk, bits);
  }
  std::vector<std::byte> wire(wire_at.back());
  const auto wire_of = [&](int k) {
    const auto ku = static_cast<std::size_t>(k);
    return std::span<std::byte>(wire).subspan(wire_at[ku], wire_at[ku + 1] - wire_at[ku]);
  };
  const Block own = block(r);
  const std::span<float> own_data = data.subspan(own.offset, own.count);
  const std::size_t own_bytes = wire_of(r).size();
  std::vector<std::byte> contrib(own_bytes * static_cast<std::size_t>(n));  // rank k's at k * own_bytes

  // Scatter-reduce: the other ranks' contributions to our block, ours to theirs.
  Works recvs, sends;
  for (int k = 0; k < n && own_bytes > 0; ++k) {
    if (k == r) continue;
    const auto part =
        std::span<std::byte>(contrib).subspan(static_cast<std::size_t>(k) * own_bytes, own_bytes);
    recvs.push_back(backend.recv(comm::Buffer::of(part), k, opts));
  }
  // Starting at r+1 spreads the first messages over all receivers; encoding block k+1 overlaps with
  // sending block k.
  for (int i = 1; i < n; ++i) {
    const int k = wrap(r + i, n);
    const Block b = block(k);
    if (b.count == 0) continue;
    const std::span<float> x = data.subspan(b.offset, b.count);
    encode(x, chunk, wire_of(k), bits);
    sends.push_back(backend.send(comm::Buffer::of(wire_of(k)), k, opts));
    count_send(stats, wire_of(k).size());
    if (feedback) {
      const std::span<float> res = residual.subspan(b.offset, b.count);
      decode(wire_of(k), chunk, res, bits);
      for (std::size_t j = 0; j < b.count; ++j) res[j] = x[j] - res[j];
    }
  }
  // Our own contribution is exact (it never travels); the others are added in rank order, so that the
  // sum does not depend on arrival order.
  for (int k = 0, i = 0; k < n && own_bytes > 0; ++k) {
    if (k == r) continue;
    deadline.wait(*recvs[static_cast<std::size_t>(i++)]);
    decode_add(
        std::span<const std::byte>(contrib).subspan(static_cast<std::size_t>(k) * own_bytes, own_bytes),
        chunk, own_data, bits);
  }
  recvs.clear();
  deadline.wait_all(sends);  // `wire` is reused for the allgather
  sends.clear();

  // The reduced blocks to the ranks that get them, compressed once by their owner.
  for (int k = 0; k < n; ++k) {
    if (k != r && !wire_of(k).empty() && gets(k, r))
      recvs.push_back(backend.recv(comm::Buffer::of(wire_of(k)), k, opts));
  }
  if (own_bytes > 0) {
    encode(own_data, chunk, wire_of(r), bits);
    for (int i = 1; i < n; ++i) {
      const int q = wrap(r + i, n);
      if (!gets(r, q)) continue;
      sends.push_back(backend.send(comm::Buffer::of(wire_of(r)), q, opts));
      count_send(stats, own_bytes);
    }
  }
  // The owner decodes its own bytes too, so that every rank that holds the block holds the same values.
  if (feedback) {
    const std::span<float> res = residual.subspan(own.offset, own.count);
    decode(wire_of(r), chunk, res, bits);
    for (std::size_t j = 0; j < own.count; ++j) {
      const float decoded = res[j];
      res[j] = own_data[j] - decoded;  // the reduced block's quantisation error, sent again next call
      own_data[j] = decoded;
    }
  } else {
    decode(wire_of(r), chunk, own_data, bits);
  }
  for (int k = 0, i = 0; k < n; ++k) {
    if (k == r || wire_of(k).empty() || !gets(k, r)) continue;
    deadline.wait(*recvs[static_cast<std::size_t>(i++)]);
    const Block b = block(k);
    decode(wire_of(k), chunk, data.subspan(b.offset, b.count), bits);
  }
  deadline.wait_all(sends);
}

}  // namespace

void compressed_allreduce(comm::Backend& backend, std::span<float> data, std::size_t chunk,
                          std::span<float> residual, const comm::Options& opts, CommStats* stats, int bits) {
  const int n = backend.size();
  std::vector<Block> blocks(static_cast<std::size_t>(n));
  for (int k = 0; k < n; ++k) blocks[static_cast<std::size_t>(k)] = block_of(data.size(), n, k);
  compressed_reduce(
      backend, data, blocks, [](int, int) { return true; }, chunk, residual, opts, stats, bits,
      "compressed_allreduce");
}

void compressed_reduce_scatter(comm::Backend& backend, std::span<float> data,
                               std::span<const std::size_t> counts, const std::function<bool(int, int)>& gets,
                               std::size_t chunk, std::span<float> residual, const comm::Options& opts,
                               CommStats* stats, int bits) {
  const int n = backend.size();
  if (counts.size() != static_cast<std::size_t>(n)) {
    SINEW_THROW(InvalidArgument, "compressed_reduce_scatter: {} block sizes for {} ranks", counts.size(), n);
  }
  std::vector<Block> blocks(counts.size());
  std::size_t at = 0;
  for (std::size_t k = 0; k < counts.size(); ++k) {
    blocks[k] = {at, counts[k]};
    at += counts[k];
  }
  if (at != data.size()) {
    SINEW_THROW(InvalidArgument, "compressed_reduce_scatter: the blocks cover {} elements, the data has {}",
                at, data.size());
  }
  compressed_reduce(backend, data, blocks, gets, chunk, residual, opts, stats, bits,
                    "compressed_reduce_scatter");
}

}  // namespace sinew::algo
