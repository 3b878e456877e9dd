#include "sinew/comm/nccl/backend.hpp"

#include <nccl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <thread>

#include "sinew/comm/nccl/api.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::comm::nccl {

namespace {

using std::chrono::milliseconds;

ncclDataType_t to_nccl(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt64:
      return ncclUint64;
    case DType::kUInt8:
      return ncclUint8;
  }
  SINEW_THROW(InvalidArgument, "nccl backend: unknown dtype {}", static_cast<int>(t));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  SINEW_THROW(InvalidArgument, "nccl backend: unknown reduce op {}", static_cast<int>(op));
}

/// `timeout` from now; a timeout too large to add to the clock is no deadline (as poll_until_complete).
Clock::time_point deadline_after(milliseconds timeout) {
  const auto now = Clock::now();
  const auto room = std::chrono::duration_cast<milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

/// Between polls: spin first (an operation often completes within microseconds), then leave the core to
/// the ranks and threads that share it.
void pause(int spins) {
  if (spins < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

/// An operation enqueued on the communication stream: complete when the event recorded after it is.
class NcclWork final : public Work {
 public:
  NcclWork(NcclBackend& backend, std::string what, cudaEvent_t event)
      : backend_(backend), what_(std::move(what)), event_(event) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  NcclWork(NcclWork&&) = delete;
  NcclWork& operator=(NcclWork&&) = delete;
  ~NcclWork() override { backend_.api().event_destroy(event_); }

  bool test() override {
    if (aborted_.load(std::memory_order_acquire)) SINEW_THROW(CommFailure, "{} was aborted", what_);
    if (done_.load(std::memory_order_acquire)) return true;
    const cudaError_t q = backend_.api().event_query(event_);
    if (q == cudaSuccess) {
      // An abort ends the communicator's kernels, which completes the event too: not a success.
      if (backend_.aborted()) backend_.check_health(what_);
      done_.store(true, std::memory_order_release);
      return true;
    }
    if (q != cudaErrorNotReady) {
      backend_.fail(what_, fmt::format("CUDA reports {}", backend_.api().cuda_error_string(q)));
    }
    backend_.check_health(what_);
    return false;
  }

  void wait(milliseconds timeout) override {
    try {
      poll_until_complete(*this, timeout, what_);
    } catch (const Timeout&) {
      backend_.abort();  // the operation stays queued on the GPU otherwise, and the peers with it
      throw;
    }
  }

  void abort() noexcept override {
    if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
    // NCCL cannot cancel one operation: an unfinished one takes the communicator with it.
    if (!done_.load(std::memory_order_acquire)) backend_.abort();
  }

 private:
  NcclBackend& backend_;
  std::string what_;
  cudaEvent_t event_;
  std::atomic<bool> done_{false};
  std::atomic<bool> aborted_{false};
};

}  // namespace

NcclBackend::NcclBackend(mpi::MpiBackend& view, Api& api, const Options& opts)
    : view_(view), api_(api), rank_(view.rank()), size_(view.size()), timeout_(opts.timeout) {
  const auto start = Clock::now();
  try {
    // Rank 0's result code travels with the id, so that the others fail with its reason instead of
    // initialising with garbage.
    std::array<std::byte, sizeof(std::int32_t) + sizeof(ncclUniqueId)> msg{};
    ncclUniqueId id{};
    if (rank_ == 0) {
      const auto r = static_cast<std::int32_t>(api_.get_unique_id(&id));
      std::memcpy(msg.data(), &r, sizeof(r));
      std::memcpy(msg.data() + sizeof(r), &id, sizeof(id));
    }
    view_.broadcast_sync(Buffer{msg.data(), msg.size(), DType::kUInt8}, 0, opts);
    std::int32_t r0 = 0;
    std::memcpy(&r0, msg.data(), sizeof(r0));
    if (r0 != ncclSuccess) {
      SINEW_THROW(CommFailure, "nccl backend: rank 0 could not create NCCL's unique id: {}",
                  api_.error_string(static_cast<ncclResult_t>(r0)));
    }
    std::memcpy(&id, msg.data() + sizeof(r0), sizeof(id));

    check_cuda(api_.stream_create(&stream_), "creating the communication stream");
    check_cuda(api_.device_alloc(&scratch_, sizeof(std::int32_t)),
               "allocating the barrier's scratch element");
    check_cuda(api_.memset_async(scratch_, 0, sizeof(std::int32_t), stream_), "clearing the scratch element");

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every wait is ours, polled against the deadline and the MPI view's failures
    ncclComm_t comm = nullptr;
    const ncclResult_t r = api_.comm_init_rank_config(&comm, size_, id, rank_, &config);
    {
      const std::lock_guard lock(mu_);
      comm_ = comm;  // even on an error: a half-built communicator is aborted, not leaked
    }
    if (r != ncclSuccess && r != ncclInProgress) {
      fail("ncclCommInitRankConfig", fmt::format("NCCL reports {}", api_.error_string(r)));
    }
    finish_enqueue(ncclInProgress, fmt::format("NCCL init of {} ranks", size_), opts.timeout);
  } catch (...) {
    release();
    throw;
  }
  init_ms_ = seconds_since(start) * 1e3;
  spdlog::debug("nccl backend: rank {} of {} up in {:.1f} ms ({})", rank_, size_, init_ms_, api_.describe());
}

NcclBackend::~NcclBackend() {
  bool healthy = false;
  {
    const std::lock_guard lock(mu_);
    healthy = comm_ != nullptr && !aborted();
  }
  if (healthy) {
    try {
      ncclResult_t r = ncclSuccess;
      {
        const std::lock_guard lock(mu_);
        if (comm_ != nullptr) r = api_.comm_finalize(comm_);
      }
      if (r != ncclSuccess && r != ncclInProgress) {
        fail("ncclCommFinalize", fmt::format("NCCL reports {}", api_.error_string(r)));
      }
      finish_enqueue(ncclInProgress, "ncclCommFinalize", timeout_);
      const std::lock_guard lock(mu_);
      if (comm_ != nullptr) api_.comm_destroy(comm_);
      comm_ = nullptr;
    } catch (const std::exception& e) {
      // fail() or the deadline aborted the communicator: nothing is leaked.
      spdlog::warn("nccl backend: clean shut-down failed, the communicator was aborted: {}", e.what());
    }
  }
  release();
}

void NcclBackend::release() noexcept {
  abort();  // nothing to do after a clean ncclCommDestroy (comm_ is null)
  try {
    if (scratch_ != nullptr) api_.device_free(scratch_);
    if (stream_ != nullptr) api_.stream_destroy(stream_);
  } catch (...) {  // a test double that throws; CUDA itself does not
  }
  scratch_ = nullptr;
  stream_ = nullptr;
}

void NcclBackend::abort() noexcept {
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  try {
    const std::lock_guard lock(mu_);
    if (comm_ != nullptr) api_.comm_abort(comm_);
    comm_ = nullptr;
    if (cause_.empty()) cause_ = "abort() was called";
  } catch (...) {  // std::mutex::lock, only on a broken invariant
  }
}

void NcclBackend::fail(std::string_view what, std::string_view cause) {
  {
    const std::lock_guard lock(mu_);
    if (cause_.empty()) cause_ = cause;
  }
  abort();
  SINEW_THROW(CommFailure, "nccl backend: {} failed: {}; the NCCL communicator was aborted", what, cause);
}

void NcclBackend::check_cuda(int error, std::string_view what) {
  if (error != cudaSuccess) {
    fail(what, fmt::format("CUDA reports {}", api_.cuda_error_string(static_cast<cudaError_t>(error))));
  }
}

void NcclBackend::check_health(std::string_view what) {
  ncclResult_t error = ncclSuccess;
  ncclResult_t r = ncclSuccess;
  std::string gone;
  {
    const std::lock_guard lock(mu_);
    if (comm_ == nullptr) {
      gone = cause_.empty() ? "the communicator is gone" : cause_;
    } else {
      r = api_.comm_get_async_error(comm_, &error);
    }
  }
  if (!gone.empty()) {
    SINEW_THROW(CommFailure, "nccl backend: {} failed: the NCCL communicator was aborted ({})", what, gone);
  }
  if (r != ncclSuccess) {
    fail(what, fmt::format("ncclCommGetAsyncError reports {}", api_.error_string(r)));
  }
  // ncclInProgress: a non-blocking call still being issued, not an error.
  if (error != ncclSuccess && error != ncclInProgress) {
    fail(what, fmt::format("NCCL reports {}", api_.error_string(error)));
  }
  // The MPI view, at most once a millisecond: about a microsecond per check, but the probe inside takes
  // MPI's locks that the training thread's own MPI calls may need.
  const std::int64_t now = now_ns();
  std::int64_t next = next_view_check_ns_.load(std::memory_order_relaxed);
  if (now >= next && next_view_check_ns_.compare_exchange_strong(next, now + 1'000'000)) {
    if (view_.failed_peers() > 0) {
      const auto ranks = view_.failed_ranks();
      fail(what, fmt::format("rank(s) {} of the MPI view died", fmt::join(ranks, ", ")));
    }
    if (view_.revoked()) fail(what, "a member revoked the MPI view after a failure");
  }
}

void NcclBackend::finish_enqueue(int result, std::string_view what, milliseconds timeout) {
  if (result == ncclSuccess) return;
  if (result != ncclInProgress) {
    fail(what, fmt::format("NCCL reports {}", api_.error_string(static_cast<ncclResult_t>(result))));
  }
  // A non-blocking communicator still issuing the call (or initialising, or finalizing): NCCL asks that
  // ncclCommGetAsyncError be polled until it leaves ncclInProgress before the next call.
  const auto deadline = deadline_after(timeout);
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclInProgress;
    std::string gone;
    {
      const std::lock_guard lock(mu_);
      if (comm_ == nullptr) {
        gone = cause_.empty() ? "the communicator is gone" : cause_;
      } else if (const ncclResult_t r = api_.comm_get_async_error(comm_, &state); r != ncclSuccess) {
        state = r;
      }
    }
    if (!gone.empty()) {
      SINEW_THROW(CommFailure, "nccl backend: {} failed: the NCCL communicator was aborted ({})", what, gone);
    }
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail(what, fmt::format("NCCL reports {}", api_.error_string(state)));
    check_health(what);  // the MPI view's failures
    if (Clock::now() > deadline) {
      abort();
      SINEW_THROW(
          Timeout,
          "nccl backend: {} did not complete within {} ms; a peer is dead, stopped or far behind; the "
          "NCCL communicator was aborted",
          what, timeout.count());
    }
    pause(spins);
  }
}

template <class F>
std::unique_ptr<Work> NcclBackend::enqueue(std::string what, milliseconds timeout, F&& call) {
  cudaEvent_t event = nullptr;
  check_cuda(api_.event_create(&event), what);
  try {
    ncclResult_t r = ncclSuccess;
    std::string gone;
    {
      const std::lock_guard lock(mu_);
      if (comm_ == nullptr) {
        gone = cause_.empty() ? "the communicator is gone" : cause_;
      } else {
        r = call(comm_);
      }
    }
    if (!gone.empty()) {
      SINEW_THROW(
          CommFailure,
          "nccl backend: {}: the NCCL communicator was aborted ({}); rebuild the backend over the new "
          "view",
          what, gone);
    }
    finish_enqueue(r, what, timeout);
    check_cuda(api_.event_record(event, stream_), what);
  } catch (...) {
    api_.event_destroy(event);
    throw;
  }
  return std::make_unique<NcclWork>(*this, std::move(what), event);
}

std::unique_ptr<Work> NcclBackend::allreduce(Buffer buf, ReduceOp op, const Options& opts) {
  const ncclDataType_t type = to_nccl(buf.dtype);
  const ncclRedOp_t red = to_nccl(op);
  return enqueue(
      fmt::format("allreduce({} x {})", buf.count, dtype_name(buf.dtype)), opts.timeout,
      [&](ncclComm_t c) { return api_.all_reduce(buf.data, buf.data, buf.count, type, red, c, stream_); });
}

std::unique_ptr<Work> NcclBackend::broadcast(Buffer buf, int root, const Options& opts) {
  if (root < 0 || root >= size_) {
    SINEW_THROW(InvalidArgument, "nccl backend: broadcast root {} is outside the group of {} ranks", root,
                size_);
  }
  const ncclDataType_t type = to_nccl(buf.dtype);
  return enqueue(
      fmt::format("broadcast({} x {} from {})", buf.count, dtype_name(buf.dtype), root), opts.timeout,
      [&](ncclComm_t c) { return api_.broadcast(buf.data, buf.data, buf.count, type, root, c, stream_); });
}

std::unique_ptr<Work> NcclBackend::allgather(Buffer in, Buffer out, const Options& opts) {
  if (in.dtype != out.dtype || out.count != in.count * static_cast<std::size_t>(size_)) {
    SINEW_THROW(InvalidArgument,
                "nccl backend: allgather needs an output of {} x {} elements of {}, got {} of {}", size_,
                in.count, dtype_name(in.dtype), out.count, dtype_name(out.dtype));
  }
  const ncclDataType_t type = to_nccl(in.dtype);
  return enqueue(
      fmt::format("allgather({} x {})", in.count, dtype_name(in.dtype)), opts.timeout,
      [&](ncclComm_t c) { return api_.all_gather(in.data, out.data, in.count, type, c, stream_); });
}

namespace {

/// Checks `counts` (one block per rank, summing to `total`); returns whether they are all equal.
bool equal_blocks(std::span<const std::size_t> counts, int ranks, std::size_t total, std::string_view what) {
  std::size_t sum = 0;
  for (const std::size_t c : counts) sum += c;
  if (counts.size() != static_cast<std::size_t>(ranks) || sum != total) {
    SINEW_THROW(InvalidArgument, "nccl backend: {} needs {} block counts summing to {}, got {} summing to {}",
                what, ranks, total, counts.size(), sum);
  }
  return std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts.front(); });
}

/// One NCCL group of `call(k, first element)` per non-empty block k (empty ones are the same on every rank:
/// skipped by all). The group is always closed, also after an error: an open group would swallow later calls.
template <class F>
ncclResult_t per_block(Api& api, std::span<const std::size_t> counts, F&& call) {
  ncclResult_t r = api.group_start();
  if (r != ncclSuccess) return r;
  std::size_t at = 0;
  for (std::size_t k = 0; k < counts.size(); at += counts[k], ++k) {
    if (counts[k] == 0) continue;
    r = call(k, at);
    if (r != ncclSuccess && r != ncclInProgress) break;
  }
  const ncclResult_t end = api.group_end();
  return r == ncclSuccess || r == ncclInProgress ? end : r;
}

}  // namespace

std::unique_ptr<Work> NcclBackend::reduce_scatter(Buffer in, Buffer out, std::span<const std::size_t> counts,
                                                  ReduceOp op, const Options& opts) {
  const bool equal = equal_blocks(counts, size_, in.count, "reduce_scatter");
  const auto me = static_cast<std::size_t>(rank_);
  if (in.dtype != out.dtype || out.count != counts[me]) {
    SINEW_THROW(InvalidArgument, "nccl backend: reduce_scatter needs an output of {} x {}, got {} x {}",
                counts[me], dtype_name(in.dtype), out.count, dtype_name(out.dtype));
  }
  const ncclDataType_t type = to_nccl(in.dtype);
  const ncclRedOp_t red = to_nccl(op);
  const std::size_t elem = dtype_size(in.dtype);
  return enqueue(fmt::format("reduce_scatter({} x {})", in.count, dtype_name(in.dtype)), opts.timeout,
                 [&](ncclComm_t c) {
                   if (equal) return api_.reduce_scatter(in.data, out.data, counts[0], type, red, c, stream_);
                   // Uneven blocks: one ncclReduce per block to its rank, in one group (NCCL runs them
                   // together; each rank sends every block once, as a reduce-scatter does).
                   return per_block(api_, counts, [&](std::size_t k, std::size_t at) {
                     const void* block = static_cast<const std::byte*>(in.data) + at * elem;
                     void* dest = k == me ? out.data : const_cast<void*>(block);  // (unused off the root)
                     return api_.reduce(block, dest, counts[k], type, red, static_cast<int>(k), c, stream_);
                   });
                 });
}

std::unique_ptr<Work> NcclBackend::allgather_v(Buffer buf, std::span<const std::size_t> counts,
                                               const Options& opts) {
  const bool equal = equal_blocks(counts, size_, buf.count, "allgather_v");
  const ncclDataType_t type = to_nccl(buf.dtype);
  const std::size_t elem = dtype_size(buf.dtype);
  return enqueue(
      fmt::format("allgather_v({} x {})", buf.count, dtype_name(buf.dtype)), opts.timeout, [&](ncclComm_t c) {
        if (equal) {  // NCCL's in-place all-gather: this rank's block is at rank * count
          const void* mine =
              static_cast<const std::byte*>(buf.data) + static_cast<std::size_t>(rank_) * counts[0] * elem;
          return api_.all_gather(mine, buf.data, counts[0], type, c, stream_);
        }
        // Uneven blocks: one in-place ncclBroadcast per block from its rank, in one group.
        return per_block(api_, counts, [&](std::size_t k, std::size_t at) {
          void* block = static_cast<std::byte*>(buf.data) + at * elem;
          return api_.broadcast(block, block, counts[k], type, static_cast<int>(k), c, stream_);
        });
      });
}

std::unique_ptr<Work> NcclBackend::send(Buffer buf, int peer, const Options& opts) {
  if (peer < 0 || peer >= size_) {
    SINEW_THROW(InvalidArgument, "nccl backend: send peer {} is outside the group of {} ranks", peer, size_);
  }
  const ncclDataType_t type = to_nccl(buf.dtype);
  return enqueue(fmt::format("send({} x {} to {})", buf.count, dtype_name(buf.dtype), peer), opts.timeout,
                 [&](ncclComm_t c) { return api_.send(buf.data, buf.count, type, peer, c, stream_); });
}

std::unique_ptr<Work> NcclBackend::recv(Buffer buf, int peer, const Options& opts) {
  if (peer < 0 || peer >= size_) {
    SINEW_THROW(InvalidArgument, "nccl backend: recv peer {} is outside the group of {} ranks", peer, size_);
  }
  const ncclDataType_t type = to_nccl(buf.dtype);
  return enqueue(fmt::format("recv({} x {} from {})", buf.count, dtype_name(buf.dtype), peer), opts.timeout,
                 [&](ncclComm_t c) { return api_.recv(buf.data, buf.count, type, peer, c, stream_); });
}

std::unique_ptr<Work> NcclBackend::exchange(std::span<const Message> sends, std::span<const Message> recvs,
                                            const Options& opts) {
  if (sends.empty() && recvs.empty()) return nullptr;
  for (const auto* list : {&sends, &recvs}) {
    for (const Message& m : *list) {
      if (m.peer < 0 || m.peer >= size_)
        SINEW_THROW(InvalidArgument, "nccl backend: exchange peer {} is outside the group of {} ranks",
                    m.peer, size_);
    }
  }
  return enqueue(fmt::format("exchange({} sends, {} receives)", sends.size(), recvs.size()), opts.timeout,
                 [&](ncclComm_t c) {
                   // One group: NCCL matches them all at once (the group is closed after an error too).
                   ncclResult_t r = api_.group_start();
                   if (r != ncclSuccess) return r;
                   for (const Message& m : recvs) {
                     if (r = api_.recv(m.buf.data, m.buf.count, to_nccl(m.buf.dtype), m.peer, c, stream_);
                         r != ncclSuccess && r != ncclInProgress)
                       break;
                   }
                   for (const Message& m : sends) {
                     if (r != ncclSuccess && r != ncclInProgress) break;
                     r = api_.send(m.buf.data, m.buf.count, to_nccl(m.buf.dtype), m.peer, c, stream_);
                   }
                   const ncclResult_t end = api_.group_end();
                   return r == ncclSuccess || r == ncclInProgress ? end : r;
                 });
}

std::unique_ptr<Work> NcclBackend::fill(Buffer buf, std::uint8_t byte) {
  if (aborted()) check_health("fill");  // throws: the communicator is gone
  check_cuda(api_.memset_async(buf.data, byte, buf.bytes(), stream_), "fill");
  return record(fmt::format("fill({} bytes)", buf.bytes()));
}

std::unique_ptr<Work> NcclBackend::barrier(const Options& opts) {
  return enqueue("barrier", opts.timeout, [&](ncclComm_t c) {
    return api_.all_reduce(scratch_, scratch_, 1, ncclInt32, ncclSum, c, stream_);
  });
}

void NcclBackend::allreduce_blocking(Buffer buf, ReduceOp op) {
  const auto work = allreduce(buf, op, Options{});
  poll_until_complete(*work, milliseconds::max(), "allreduce");  // no deadline: see the header
}

std::unique_ptr<Work> NcclBackend::all_to_all(Buffer in, Buffer out, const Options& opts) {
  const auto n = static_cast<std::size_t>(size_);
  if (in.dtype != out.dtype || in.count != out.count || in.count % n != 0) {
    SINEW_THROW(InvalidArgument,
                "nccl backend: all_to_all needs input and output of equal length and type, divisible into {} "
                "segments; got {} x {} and {} x {}",
                size_, in.count, dtype_name(in.dtype), out.count, dtype_name(out.dtype));
  }
  const ncclDataType_t type = to_nccl(in.dtype);
  const std::size_t seg = in.count / n;
  const std::size_t seg_bytes = seg * dtype_size(in.dtype);
  return enqueue(
      fmt::format("all_to_all({} x {})", in.count, dtype_name(in.dtype)), opts.timeout, [&](ncclComm_t c) {
        ncclResult_t r = api_.group_start();
        if (r != ncclSuccess) return r;
        for (std::size_t p = 0; p < n && (r == ncclSuccess || r == ncclInProgress); ++p) {
          const auto peer = static_cast<int>(p);
          r = api_.send(static_cast<const std::byte*>(in.data) + p * seg_bytes, seg, type, peer, c, stream_);
          if (r == ncclSuccess || r == ncclInProgress) {
            r = api_.recv(static_cast<std::byte*>(out.data) + p * seg_bytes, seg, type, peer, c, stream_);
          }
        }
        // Always closed, also after an error: an open group would swallow the next calls.
        const ncclResult_t end = api_.group_end();
        return r == ncclSuccess || r == ncclInProgress ? end : r;
      });
}

void NcclBackend::wait_event(cudaEvent_t event) {
  check_cuda(api_.stream_wait_event(stream_, event), "making the communication stream wait for an event");
}

std::unique_ptr<Work> NcclBackend::record(std::string what) {
  if (aborted()) check_health(what);  // throws: the communicator is gone
  cudaEvent_t event = nullptr;
  check_cuda(api_.event_create(&event), what);
  try {
    check_cuda(api_.event_record(event, stream_), what);
  } catch (...) {
    api_.event_destroy(event);
    throw;
  }
  return std::make_unique<NcclWork>(*this, std::move(what), event);
}

}  // namespace sinew::comm::nccl
