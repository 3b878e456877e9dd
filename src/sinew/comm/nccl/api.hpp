// The NCCL and CUDA entry points of the NCCL backend, behind one small virtual table.
//
// Two reasons for the table. NCCL is not linked: real_api() opens libnccl.so.2 at run time, so that Sinew's
// binaries run where NCCL is absent and only `--device cuda` fails there, with a message naming the library.
// And a test double (FakeApi, tests/mpi/nccl_fake.hpp: test code, not in libsinew) can stand in for NCCL and
// for the few CUDA stream and event calls the backend makes, so that bootstrap, failure handling and recovery
// are tested over MPI ranks on machines without a GPU. Only the calls the backend uses are here; each one has
// NCCL's or CUDA's meaning and return codes.
//
// This header needs nccl.h (the library's PRIVATE include directory, ${SINEW_NCCL_INCLUDE}): it is for the
// backend's implementation, the fake and the tests. The backend's own header (backend.hpp) does not need it.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <string>

namespace sinew::comm::nccl {

class Api {
 public:
  Api() = default;
  Api(const Api&) = delete;
  Api& operator=(const Api&) = delete;
  Api(Api&&) = delete;
  Api& operator=(Api&&) = delete;
  virtual ~Api() = default;

  /// What is behind the table ("libnccl.so.2, NCCL 2.28.9", "fake NCCL"), for logs.
  [[nodiscard]] virtual std::string describe() const = 0;

  // NCCL (the backend uses non-blocking communicators only: calls may return ncclInProgress).
  virtual ncclResult_t get_unique_id(ncclUniqueId* id) = 0;
  virtual ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                             ncclConfig_t* config) = 0;
  virtual ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* error) = 0;
  virtual ncclResult_t comm_abort(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_finalize(ncclComm_t comm) = 0;
  virtual ncclResult_t comm_destroy(ncclComm_t comm) = 0;
  virtual ncclResult_t all_reduce(const void* in, void* out, std::size_t count, ncclDataType_t type,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t broadcast(const void* in, void* out, std::size_t count, ncclDataType_t type, int root,
                                 ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t all_gather(const void* in, void* out, std::size_t count, ncclDataType_t type,
                                  ncclComm_t comm, cudaStream_t stream) = 0;
  /// ncclReduce: the reduction of every rank's `in` arrives in `out` at `root` (`out` unused elsewhere).
  virtual ncclResult_t reduce(const void* in, void* out, std::size_t count, ncclDataType_t type,
                              ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) = 0;
  /// ncclReduceScatter: `in` holds nranks blocks of `count`; block r's reduction arrives in rank r's `out`.
  virtual ncclResult_t reduce_scatter(const void* in, void* out, std::size_t count, ncclDataType_t type,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t send(const void* buf, std::size_t count, ncclDataType_t type, int peer,
                            ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t recv(void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                            cudaStream_t stream) = 0;
  virtual ncclResult_t group_start() = 0;
  virtual ncclResult_t group_end() = 0;
  virtual const char* error_string(ncclResult_t result) = 0;

  // CUDA: the communication stream, the events that mark completion, device scratch memory.
  /// A non-blocking stream (no implicit synchronisation with the legacy default stream).
  virtual cudaError_t stream_create(cudaStream_t* stream) = 0;
  virtual cudaError_t stream_destroy(cudaStream_t stream) = 0;
  /// An event without timing (cheaper to record and query).
  virtual cudaError_t event_create(cudaEvent_t* event) = 0;
  virtual cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) = 0;
  /// cudaSuccess once complete, cudaErrorNotReady before; never blocks.
  virtual cudaError_t event_query(cudaEvent_t event) = 0;
  virtual cudaError_t event_destroy(cudaEvent_t event) = 0;
  virtual cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event) = 0;
  virtual cudaError_t device_alloc(void** ptr, std::size_t bytes) = 0;
  virtual cudaError_t device_free(void* ptr) = 0;
  virtual cudaError_t memset_async(void* ptr, int value, std::size_t bytes, cudaStream_t stream) = 0;
  virtual const char* cuda_error_string(cudaError_t error) = 0;
};

/// The real NCCL, opened with dlopen on first use ("libnccl.so.2", or the path in SINEW_NCCL_LIBRARY) and
/// resolved once, and the CUDA runtime. Throws InvalidArgument naming the library and dlerror()'s text when
/// it cannot be opened, lacks an entry point, or is older than 2.14 (no non-blocking communicators,
/// ncclCommFinalize); a later call tries again.
Api& real_api();

}  // namespace sinew::comm::nccl
