// FakeApi: a TEST DOUBLE for NCCL and the CUDA calls of the NCCL backend (comm/nccl/api.hpp), for tests on
// machines without a GPU. It is not a transport to train with, and it is not part of libsinew: it is the
// test-only static library sinew_nccl_fake (tests/mpi/CMakeLists.txt), linked by the tests that use it.
//
// It is a real multi-process stand-in: the ranks of a communicator meet in a POSIX shared-memory segment
// named after the unique id (/dev/shm/sinew-fake-nccl-<hex>), so that an MPI job of several processes can
// bootstrap, run collectives and lose a member exactly as with NCCL. "Device memory" is host memory
// (device_alloc is calloc). Streams and events are fake handles: a stream is a queue of operations that
// advances only when someone polls (event_query, comm_get_async_error), the way a GPU advances while the
// host looks elsewhere; nothing in the fake ever blocks.
//
// NCCL's non-blocking semantics are kept where the backend relies on them:
//   - comm_init_rank_config returns at once; comm_get_async_error says ncclInProgress until all nranks
//     attached, then ncclSuccess (only non-blocking configurations are accepted);
//   - a collective (allreduce, reduce and reduce-scatter with sum/max/min of every NCCL type, broadcast,
//     allgather) completes when every rank posted it; send is eager (buffered), recv completes when the
//     message is there;
//   - a member that died (its pid, registered in the segment, no longer exists) makes comm_get_async_error
//     report ncclRemoteError a short while after an operation started waiting for it
//     (DeadPeer::kRemoteError), or nothing at all, the operation simply never completing
//     (DeadPeer::kNeverComplete: what NCCL does when the network does not notice, which only the MPI view's
//     failure state can end);
//   - comm_abort ends everything of that communicator locally at once: its queued operations are dropped,
//     so events recorded after them complete.
// It also counts what the tests assert on: communicators alive (created and neither destroyed nor aborted),
// and every call made on an aborted or destroyed communicator (use after abort), recorded with its name.
// Segments are unlinked by the last member that leaves, and at abort (best effort: a peer that died can
// never leave).
//
// Limits: one contribution (a rank's part of a collective, one message) holds at most Config::slot_bytes;
// a larger one fails with ncclInvalidArgument. At most kMaxRanks ranks.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sinew/comm/nccl/api.hpp"

namespace sinew::comm::nccl {

class FakeApi final : public Api {
 public:
  static constexpr int kMaxRanks = 64;

  enum class DeadPeer : std::uint8_t {
    kRemoteError,   ///< comm_get_async_error reports ncclRemoteError after Config::remote_error_after
    kNeverComplete  ///< the operation never completes and no error is reported
  };

  struct Config {
    DeadPeer dead_peer = DeadPeer::kRemoteError;
    /// How long after an operation started waiting for a dead member the error is reported.
    std::chrono::milliseconds remote_error_after{50};
    /// The largest contribution of one rank to one operation (all ranks of a communicator must agree).
    std::size_t slot_bytes = std::size_t{256} << 10;
  };

  /// What was enqueued, in order, for tests of the overlap (which stream waited on which event, which
  /// buffers were reduced in which order).
  struct JournalEntry {
    enum class Kind : std::uint8_t { kCollective, kSend, kRecv, kStreamWait };
    Kind kind = Kind::kCollective;
    std::string
        op;  ///< "allreduce", "broadcast", "allgather", "reduce", "reduce_scatter", "send", "recv", "wait"
    const void* data = nullptr;
    std::size_t count = 0;
    cudaStream_t stream = nullptr;
    cudaEvent_t event = nullptr;  ///< kStreamWait: the event waited on
    int group = 0;                ///< the NCCL group it was issued in (numbered from 1); 0: none
  };

  FakeApi() : FakeApi(Config{}) {}
  explicit FakeApi(Config config);
  FakeApi(const FakeApi&) = delete;
  FakeApi& operator=(const FakeApi&) = delete;
  FakeApi(FakeApi&&) = delete;
  FakeApi& operator=(FakeApi&&) = delete;
  /// Unmaps what is still mapped (communicators leaked by the code under test stay counted, not freed).
  ~FakeApi() override;

  [[nodiscard]] std::string describe() const override { return "fake NCCL (test double, shared memory)"; }

  ncclResult_t get_unique_id(ncclUniqueId* id) override;
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) override;
  ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* error) override;
  ncclResult_t comm_abort(ncclComm_t comm) override;
  ncclResult_t comm_finalize(ncclComm_t comm) override;
  ncclResult_t comm_destroy(ncclComm_t comm) override;
  ncclResult_t all_reduce(const void* in, void* out, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                          ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t broadcast(const void* in, void* out, std::size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t all_gather(const void* in, void* out, std::size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream) override;
  ncclResult_t reduce(const void* in, void* out, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                      int root, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t reduce_scatter(const void* in, void* out, std::size_t count, ncclDataType_t type,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t send(const void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override;
  ncclResult_t recv(void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override;
  ncclResult_t group_start() override;
  ncclResult_t group_end() override;
  const char* error_string(ncclResult_t result) override;

  cudaError_t stream_create(cudaStream_t* stream) override;
  cudaError_t stream_destroy(cudaStream_t stream) override;
  cudaError_t event_create(cudaEvent_t* event) override;
  cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) override;
  cudaError_t event_query(cudaEvent_t event) override;
  cudaError_t event_destroy(cudaEvent_t event) override;
  cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event) override;
  cudaError_t device_alloc(void** ptr, std::size_t bytes) override;
  cudaError_t device_free(void* ptr) override;
  cudaError_t memset_async(void* ptr, int value, std::size_t bytes, cudaStream_t stream) override;
  const char* cuda_error_string(cudaError_t error) override;

  // ---- for tests ----
  /// Communicators created and neither destroyed nor aborted.
  [[nodiscard]] int live_comms() const;
  /// Communicators ever created, and of those aborted.
  [[nodiscard]] int comms_created() const;
  [[nodiscard]] int comms_aborted() const;
  /// Calls made on an aborted or destroyed communicator (or on a handle the fake never made), by name.
  [[nodiscard]] std::vector<std::string> misuse() const;
  /// Streams and events created and not destroyed.
  [[nodiscard]] int live_streams() const;
  [[nodiscard]] int live_events() const;
  [[nodiscard]] std::vector<JournalEntry> journal() const;
  void clear_journal();
  /// A held stream does not advance (a compute stream whose kernels are still running): events recorded
  /// on it stay incomplete, and streams that wait on them stall, until it is released.
  void hold(cudaStream_t stream, bool held);
  /// The shared-memory names of the communicators this fake created (to check they were unlinked).
  [[nodiscard]] std::vector<std::string> segment_names() const;

  struct Comm;
  struct Stream;
  struct Event;
  struct Op;

 private:
  Comm* comm_of(ncclComm_t comm, const char* call);  // null (and misuse recorded) unless usable
  Stream* stream_of(cudaStream_t stream);
  ncclResult_t enqueue(Op op, cudaStream_t stream);
  /// enqueue() with the communicator's next collective sequence number (op.comm is set, mu_ held).
  ncclResult_t enqueue_collective(Op op, cudaStream_t stream);
  /// A collective call of NCCL's `call`: checks the communicator, the reduction and the root, then
  /// enqueue_collective() (takes mu_).
  ncclResult_t collective(const char* call, Op o, ncclComm_t comm, cudaStream_t stream);
  /// ncclSend (send) or ncclRecv.
  ncclResult_t point_to_point(bool send, const void* in, void* out, std::size_t count, ncclDataType_t type,
                              int peer, ncclComm_t comm, cudaStream_t stream);
  bool advance(Stream& s, int depth);  // true if the stream's queue is empty afterwards
  bool step(Op& op, int depth);        // one attempt at the head operation; true once it completed
  void check_dead(Comm& c);
  void leave(Comm& c, bool aborted);
  void drop_ops_of(const Comm& c);

  Config config_;
  mutable std::mutex mu_;  // guards everything below; the fake never blocks while holding it
  std::vector<std::unique_ptr<Comm>> comms_;  // never freed before the fake: a stale handle stays detectable
  std::map<cudaStream_t, std::unique_ptr<Stream>> streams_;
  std::map<cudaEvent_t, std::unique_ptr<Event>> events_;
  std::unique_ptr<Stream> default_stream_;
  std::uintptr_t next_handle_ = 0x1000;
  std::vector<std::string> misuse_;
  std::vector<JournalEntry> journal_;
  int group_depth_ = 0;  // ncclGroupStart calls not yet ended
  int groups_ = 0;       // outermost groups started
  int live_ = 0;
  int aborted_ = 0;
};

}  // namespace sinew::comm::nccl
