// The communication-backend interface: collectives and point-to-point over the current group.
//
// Every operation is started without blocking and returns a Work (PyTorch c10d style). Work::wait takes a
// deadline: an operation that has not completed by then throws sinew::Timeout instead of hanging; the
// caller then aborts the backend (which, with ULFM, revokes the communicator so that peers blocked in the
// same operation return too) and rebuilds the group. A backend that does not support an operation throws
// InvalidArgument naming the backend.
//
// An operation can also be ended early with Work::abort(), and a whole backend with Backend::abort().
//
// Implementations live in one folder each with the same file names: comm/mpi/ (MPI), comm/ring/ (Sinew's
// own ring allreduce over another backend's point-to-point operations), later comm/nccl/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "sinew/core/names.hpp"

namespace sinew::comm {

using namespace std::chrono_literals;

enum class DType : std::uint8_t { kFloat32, kFloat64, kInt32, kInt64, kUInt64, kUInt8 };
enum class ReduceOp : std::uint8_t { kSum, kMax, kMin };

std::size_t dtype_size(DType t) noexcept;
inline constexpr NameTable<DType, 6> kDTypeNames{{{DType::kFloat32, "float"},
                                                  {DType::kFloat64, "double"},
                                                  {DType::kInt32, "int32"},
                                                  {DType::kInt64, "int64"},
                                                  {DType::kUInt64, "uint64"},
                                                  {DType::kUInt8, "uint8"}}};
inline constexpr NameTable<ReduceOp, 3> kReduceOpNames{
    {{ReduceOp::kSum, "sum"}, {ReduceOp::kMax, "max"}, {ReduceOp::kMin, "min"}}};
constexpr std::string_view dtype_name(DType t) noexcept { return name_of(kDTypeNames, t); }
constexpr std::string_view reduce_op_name(ReduceOp op) noexcept { return name_of(kReduceOpNames, op); }

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::kInt64;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return DType::kUInt64;
  else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::byte>)
    return DType::kUInt8;
  else
    static_assert(!sizeof(T), "unsupported element type");
}

/// A typed view of memory handed to a backend; the caller keeps it alive until the Work completes.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;  ///< elements, not bytes
  DType dtype = DType::kUInt8;

  template <class T>
  static Buffer of(std::span<T> s) {
    return {const_cast<std::remove_const_t<T>*>(s.data()), s.size(), dtype_of<std::remove_const_t<T>>()};
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return count * dtype_size(dtype); }
};

/// Per-operation options.
struct Options {
  /// How long wait() may block before it throws Timeout. Generous by default: a big first allreduce on
  /// an oversubscribed node can take seconds; a hung peer must still never block forever.
  std::chrono::milliseconds timeout = 300s;
  int tag = 0;  ///< point-to-point tag
};

/// What operations put on the wire from this rank, for the backends and algorithms that count it
/// (comm/ring/, algo/); they add to it.
struct CommStats {
  std::uint64_t bytes_sent = 0;     ///< payload bytes this rank sent
  std::uint64_t messages_sent = 0;  ///< point-to-point messages this rank sent
};

/// An operation in flight. It must not outlive the backend that started it.
class Work {
 public:
  Work() = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual ~Work() = default;
  /// Makes progress; true once complete. Throws CommFailure if the operation failed or was aborted.
  virtual bool test() = 0;
  /// Blocks until complete. Throws Timeout after `timeout`, CommFailure if a peer failed or the
  /// operation was aborted (also from another thread while this one waits).
  /// After an exception the operation's buffers are in an unspecified state.
  virtual void wait(std::chrono::milliseconds timeout) = 0;
  /// Ends the operation without waiting for it: afterwards it counts as finished, and test() and wait()
  /// throw CommFailure at once (even if it had completed before: the caller asked to give it up).
  /// Never throws; idempotent; may be called from another thread while one blocks in wait().
  ///
  /// What happens underneath depends on what the transport can cancel. A point-to-point operation is
  /// cancelled alone and the backend stays usable (but a message the peer already sent for it may still
  /// arrive, and a transfer already under way may still complete into the buffer). A collective that
  /// has not completed cannot be cancelled on its own (MPI has no such call) and would leave the group's
  /// collectives out of step, so aborting it aborts the backend that started it (Backend::abort(): with
  /// ULFM the peers blocked in it return too). After abort() the buffers are in an unspecified state.
  virtual void abort() noexcept = 0;
};

/// One Work for several (null ones skipped): complete once all are; wait() shares one deadline among them;
/// abort() aborts every one.
std::unique_ptr<Work> all_of(std::vector<std::unique_ptr<Work>> works);

/// The polling loop behind Work::wait(): calls w.test() until it returns true, first spinning (latency
/// of small messages), then yielding the core, then (after 2 ms) sleeping 50 us between polls, since
/// ranks often share cores with each other and with the compute thread. Throws Timeout "WHAT did not
/// complete within T ms" once `timeout` has passed; a timeout too large to add to the clock is no
/// deadline at all. Exceptions of test() pass through. `progress`, if not null, is a count that an
/// operation of many messages raises (in test()) whenever one of them completes: the loop then goes back
/// to spinning, as it would for the first message of a fresh wait.
void poll_until_complete(Work& w, std::chrono::milliseconds timeout, std::string_view what,
                         const std::uint64_t* progress = nullptr);

class Backend {
 public:
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  virtual ~Backend() = default;
  [[nodiscard]] virtual std::string name() const = 0;
  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;

  /// In-place reduction of `buf` over all ranks.
  virtual std::unique_ptr<Work> allreduce(Buffer buf, ReduceOp op, const Options& opts) = 0;
  /// In-place broadcast of `buf` from `root`.
  virtual std::unique_ptr<Work> broadcast(Buffer buf, int root, const Options& opts) = 0;
  /// Gathers `in` from every rank into `out` (size() * in.count elements, rank order).
  virtual std::unique_ptr<Work> allgather(Buffer in, Buffer out, const Options& opts) = 0;
  /// Reduce-scatter of uneven blocks: `in` is cut into size() contiguous blocks of `counts` elements (rank
  /// order, summing to in.count); rank r receives the reduction of block r over all ranks in `out`
  /// (counts[r] elements). Base: throws InvalidArgument naming the backend (sharded gradients need it).
  virtual std::unique_ptr<Work> reduce_scatter(Buffer in, Buffer out, std::span<const std::size_t> counts,
                                               ReduceOp op, const Options& opts);
  /// All-gather of uneven blocks, in place: `buf` is cut as reduce_scatter's `in`; each rank contributes
  /// its own block and ends with every block. Base: throws InvalidArgument naming the backend.
  virtual std::unique_ptr<Work> allgather_v(Buffer buf, std::span<const std::size_t> counts,
                                            const Options& opts);
  virtual std::unique_ptr<Work> send(Buffer buf, int peer, const Options& opts) = 0;
  virtual std::unique_ptr<Work> recv(Buffer buf, int peer, const Options& opts) = 0;
  virtual std::unique_ptr<Work> barrier(const Options& opts) = 0;
  /// One buffer to or from one peer, for exchange().
  struct Message {
    Buffer buf;
    int peer = 0;
  };
  /// Point-to-point messages posted together: every receive, then every send, as one Work that completes
  /// when all have (null when there are none). Two ranks that send each other something this way cannot
  /// deadlock, whatever the transport: NCCL runs them as one group (its plain sends may block the stream
  /// until the peer's receive runs). Base: recv() and send() each.
  virtual std::unique_ptr<Work> exchange(std::span<const Message> sends, std::span<const Message> recvs,
                                         const Options& opts);
  /// Sets every byte of `buf` to `byte`, in order with this backend's operations (NCCL: a memset on its
  /// stream, for device memory; base: at once, host memory). Returns a Work that completes with it.
  virtual std::unique_ptr<Work> fill(Buffer buf, std::uint8_t byte);

  /// In-place reduction run to completion on the calling thread, with the transport's fastest (tuned,
  /// blocking) algorithm. It has no deadline of its own: whoever waits for the calling thread bounds it,
  /// and when the bound passes calls abort() from another thread, which (with ULFM) makes this call
  /// return with CommFailure. The bucketer's communication thread uses it this way.
  virtual void allreduce_blocking(Buffer buf, ReduceOp op) = 0;

  /// Makes every pending and future operation of this backend fail promptly, here and (where the
  /// transport allows, e.g. ULFM revoke) at the peers. Used after a Timeout or a failure. Never throws;
  /// idempotent; may be called from any thread.
  virtual void abort() noexcept = 0;

  // Blocking conveniences: start, then wait with opts.timeout.
  void allreduce_sync(Buffer buf, ReduceOp op, const Options& opts = {}) {
    allreduce(buf, op, opts)->wait(opts.timeout);
  }
  void broadcast_sync(Buffer buf, int root, const Options& opts = {}) {
    broadcast(buf, root, opts)->wait(opts.timeout);
  }
  void allgather_sync(Buffer in, Buffer out, const Options& opts = {}) {
    allgather(in, out, opts)->wait(opts.timeout);
  }
  void barrier_sync(const Options& opts = {}) { barrier(opts)->wait(opts.timeout); }
  /// The `bytes` of the lowest rank whose `have` is true, on every member (empty if none has them).
  std::string share_sync(const std::string& bytes, bool have, const Options& opts = {});
};

}  // namespace sinew::comm
