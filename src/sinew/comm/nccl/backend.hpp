// The NCCL backend: Sinew's Backend over an NCCL communicator, for gradients in GPU memory.
//
// Bootstrap. The communicator is built over the current MPI view: rank 0 creates NCCL's unique id, the
// view's existing MPI backend broadcasts it (no new MPI_Comm_dup: a second duplicate next to the group's
// failed after a shrink-then-grow), then every rank calls ncclCommInitRankConfig in non-blocking mode and
// polls it against the deadline.
//
// Failure handling. NCCL waits for its peers on the GPU, outside MPI, and may never notice one that died
// (or notice it only at its own network timeouts). So every wait here (init, each operation, finalize) is
// a poll of three things together: the operation's completion (a CUDA event recorded after it),
// ncclCommGetAsyncError, and, every millisecond, the MPI view's failure state
// (mpi::MpiBackend::failed_peers(), ULFM): a SIGKILLed peer ends an NCCL wait in about 10-30 ms instead of at
// the collective deadline. Any failure aborts the NCCL communicator (ncclCommAbort, which also ends its
// kernels) and throws CommFailure naming the operation and the cause. Recovery is then the caller's:
// abort this backend first, then the MPI view, shrink or grow the group, and build a new NcclBackend over
// the new view (the old one is never used again; its destructor frees what is left).
//
// Operations take device pointers (Buffer::data in GPU memory of the current device) and are enqueued on
// this backend's communication stream, stream(): they are ordered with each other, not with the caller's
// streams. NCCL has no tags: Options::tag is ignored, messages between two ranks match in order. NCCL cannot
// cancel one operation, so Work::abort() of any operation aborts the whole backend.
//
// The NCCL and CUDA calls go through an Api (api.hpp): real_api() in production, a FakeApi
// (tests/mpi/nccl_fake.hpp) in tests. This header does not need nccl.h.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "sinew/comm/backend.hpp"
#include "sinew/comm/mpi/backend.hpp"

struct ncclComm;  // NCCL's opaque communicator (nccl.h: typedef struct ncclComm* ncclComm_t)

namespace sinew::comm::nccl {

class Api;

class NcclBackend final : public Backend {
 public:
  /// Collective over `view`: bootstrap as above, on the current CUDA device, within `opts.timeout`. Throws
  /// CommFailure if a member of the view fails or NCCL reports an error meanwhile, Timeout past the deadline
  /// (with nothing left behind: the half-built communicator is aborted). `view` and `api` must outlive this.
  NcclBackend(mpi::MpiBackend& view, Api& api, const Options& opts = {});
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;
  NcclBackend(NcclBackend&&) = delete;
  NcclBackend& operator=(NcclBackend&&) = delete;
  /// Healthy: ncclCommFinalize (completes the operations in flight), polled like an operation, then
  /// ncclCommDestroy. After a failure, or if finalizing fails or misses the deadline: ncclCommAbort. Never
  /// throws.
  ~NcclBackend() override;

  [[nodiscard]] std::string name() const override { return "nccl"; }
  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }

  std::unique_ptr<Work> allreduce(Buffer buf, ReduceOp op, const Options& opts) override;
  std::unique_ptr<Work> broadcast(Buffer buf, int root, const Options& opts) override;
  std::unique_ptr<Work> allgather(Buffer in, Buffer out, const Options& opts) override;
  /// Blocks of equal counts: ncclReduceScatter. Uneven ones (a flat buffer's shards): one ncclReduce per
  /// non-empty block to its rank, in one NCCL group. `in` and `out` are device memory.
  std::unique_ptr<Work> reduce_scatter(Buffer in, Buffer out, std::span<const std::size_t> counts,
                                       ReduceOp op, const Options& opts) override;
  /// In place. Blocks of equal counts: NCCL's in-place ncclAllGather; uneven ones: one ncclBroadcast per
  /// non-empty block from its rank, in one NCCL group.
  std::unique_ptr<Work> allgather_v(Buffer buf, std::span<const std::size_t> counts,
                                    const Options& opts) override;
  /// Point-to-point: each is an NCCL operation of its own on the one communication stream, so a rank's sends
  /// and receives run in the order it posted them, and a send may block the stream until the peer's
  /// receive runs: two ranks that each send to the other before receiving can deadlock (as with plain
  /// ncclSend/ncclRecv). Exchanges go through exchange() or all_to_all (one NCCL group each).
  std::unique_ptr<Work> send(Buffer buf, int peer, const Options& opts) override;
  std::unique_ptr<Work> recv(Buffer buf, int peer, const Options& opts) override;
  /// One NCCL group of every receive and send.
  std::unique_ptr<Work> exchange(std::span<const Message> sends, std::span<const Message> recvs,
                                 const Options& opts) override;
  /// cudaMemsetAsync on stream(), after everything enqueued before it.
  std::unique_ptr<Work> fill(Buffer buf, std::uint8_t byte) override;
  /// A one-element allreduce of a small device scratch buffer: NCCL has no barrier, and its collectives
  /// complete at a rank only after every rank reached them. It orders the communication stream only.
  std::unique_ptr<Work> barrier(const Options& opts) override;
  /// Enqueues, then polls without a deadline (see Backend): abort() from another thread, an NCCL error or
  /// a dead member of the view end it with CommFailure.
  void allreduce_blocking(Buffer buf, ReduceOp op) override;
  /// `in` and `out` hold size() equal segments (count divisible by size()); segment k of `in` goes to rank
  /// k, segment k of `out` comes from rank k. One NCCL group of sends and receives.
  std::unique_ptr<Work> all_to_all(Buffer in, Buffer out, const Options& opts);

  /// ncclCommAbort, once (thread-safe, idempotent; never throws). Pending and later operations fail with
  /// CommFailure. It does not touch the MPI view: whoever owns both aborts this first, then the view.
  void abort() noexcept override;
  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// Milliseconds the constructor took (id broadcast + NCCL init), for the recovery breakdown.
  [[nodiscard]] double init_ms() const noexcept { return init_ms_; }
  /// The communication stream: every operation of this backend runs on it, in order.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] Api& api() const noexcept { return api_; }

  /// Makes the communication stream wait for `event` (recorded on another stream) before what is enqueued
  /// next; the host does not wait. Throws CommFailure (after abort()) on a CUDA error.
  void wait_event(cudaEvent_t event);
  /// A Work that completes once everything enqueued on stream() so far (also kernels enqueued there by the
  /// caller, e.g. ByteGrad's codec) has completed, polled like every operation.
  std::unique_ptr<Work> record(std::string what);

  /// One health check, for loops that poll several operations: throws CommFailure (after abort()) if this
  /// backend was aborted, NCCL reports an error, or (throttled to once a millisecond) a member of the MPI
  /// view failed. `what` names the operation in the message.
  void check_health(std::string_view what);
  /// Aborts, then throws CommFailure "nccl backend: WHAT failed: CAUSE". For this backend's Works.
  [[noreturn]] void fail(std::string_view what, std::string_view cause);

 private:
  template <class F>
  std::unique_ptr<Work> enqueue(std::string what, std::chrono::milliseconds timeout, F&& call);
  void finish_enqueue(int result, std::string_view what, std::chrono::milliseconds timeout);
  void check_cuda(int error, std::string_view what);
  void release() noexcept;  // the constructor's clean-up after a failure, and the destructor's last step

  mpi::MpiBackend& view_;
  Api& api_;
  int rank_ = 0;
  int size_ = 1;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;             // serialises every NCCL call on comm_ (abort() may come from another thread)
  ncclComm* comm_ = nullptr;  // guarded by mu_; null once aborted or destroyed
  std::atomic<bool> aborted_{false};
  std::atomic<std::int64_t> next_view_check_ns_{0};
  std::string cause_;  // guarded by mu_: why the backend was aborted, for later operations' messages
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;  // device: the barrier's element
  double init_ms_ = 0;
};

}  // namespace sinew::comm::nccl
