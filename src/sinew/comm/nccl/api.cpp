#include "sinew/comm/nccl/api.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "sinew/core/error.hpp"

namespace sinew::comm::nccl {

namespace {

/// NCCL's entry points, resolved from the library opened at run time. The CUDA calls go to the runtime
/// linked into Sinew (cudart_static).
class RealApi final : public Api {
 public:
  RealApi() {
    const char* env = std::getenv("SINEW_NCCL_LIBRARY");
    path_ = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    // RTLD_LOCAL: NCCL's symbols stay out of the global namespace (a second NCCL, e.g. PyTorch's, cannot
    // clash); RTLD_NOW: a broken library fails here, with dlerror(), not at the first collective.
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      SINEW_THROW(InvalidArgument,
                  "NCCL is not available: dlopen(\"{}\") failed: {}. --device cuda needs NCCL 2.14 or later: "
                  "install it (libnccl2) or set SINEW_NCCL_LIBRARY to the path of libnccl.so.2",
                  path_, why != nullptr ? why : "unknown error");
    }
    try {
      resolve(get_version_, "ncclGetVersion");
      resolve(get_unique_id_, "ncclGetUniqueId");
      resolve(comm_init_rank_config_, "ncclCommInitRankConfig");
      resolve(comm_get_async_error_, "ncclCommGetAsyncError");
      resolve(comm_abort_, "ncclCommAbort");
      resolve(comm_finalize_, "ncclCommFinalize");
      resolve(comm_destroy_, "ncclCommDestroy");
      resolve(all_reduce_, "ncclAllReduce");
      resolve(broadcast_, "ncclBroadcast");
      resolve(all_gather_, "ncclAllGather");
      resolve(reduce_, "ncclReduce");
      resolve(reduce_scatter_, "ncclReduceScatter");
      resolve(send_, "ncclSend");
      resolve(recv_, "ncclRecv");
      resolve(group_start_, "ncclGroupStart");
      resolve(group_end_, "ncclGroupEnd");
      resolve(error_string_, "ncclGetErrorString");
      if (get_version_(&version_) != ncclSuccess) version_ = 0;
      if (version_ < 21400) {
        SINEW_THROW(InvalidArgument,
                    "{} is NCCL version code {}; Sinew needs NCCL 2.14 or later (non-blocking communicators, "
                    "ncclCommFinalize)",
                    path_, version_);
      }
    } catch (...) {
      dlclose(handle_);
      throw;
    }
  }
  RealApi(const RealApi&) = delete;
  RealApi& operator=(const RealApi&) = delete;
  RealApi(RealApi&&) = delete;
  RealApi& operator=(RealApi&&) = delete;
  // The library stays open until the process exits: communicators may be destroyed during static
  // destruction, after this object would be gone.
  ~RealApi() override = default;

  [[nodiscard]] std::string describe() const override {
    // Codes since 2.9: major * 10000 + minor * 100 + patch.
    return fmt::format("{}, NCCL {}.{}.{}", path_, version_ / 10000, version_ / 100 % 100, version_ % 100);
  }

  ncclResult_t get_unique_id(ncclUniqueId* id) override { return get_unique_id_(id); }
  ncclResult_t comm_init_rank_config(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t* config) override {
    return comm_init_rank_config_(comm, nranks, id, rank, config);
  }
  ncclResult_t comm_get_async_error(ncclComm_t comm, ncclResult_t* error) override {
    return comm_get_async_error_(comm, error);
  }
  ncclResult_t comm_abort(ncclComm_t comm) override { return comm_abort_(comm); }
  ncclResult_t comm_finalize(ncclComm_t comm) override { return comm_finalize_(comm); }
  ncclResult_t comm_destroy(ncclComm_t comm) override { return comm_destroy_(comm); }
  ncclResult_t all_reduce(const void* in, void* out, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                          ncclComm_t comm, cudaStream_t stream) override {
    return all_reduce_(in, out, count, type, op, comm, stream);
  }
  ncclResult_t broadcast(const void* in, void* out, std::size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) override {
    return broadcast_(in, out, count, type, root, comm, stream);
  }
  ncclResult_t all_gather(const void* in, void* out, std::size_t count, ncclDataType_t type, ncclComm_t comm,
                          cudaStream_t stream) override {
    return all_gather_(in, out, count, type, comm, stream);
  }
  ncclResult_t reduce(const void* in, void* out, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                      int root, ncclComm_t comm, cudaStream_t stream) override {
    return reduce_(in, out, count, type, op, root, comm, stream);
  }
  ncclResult_t reduce_scatter(const void* in, void* out, std::size_t count, ncclDataType_t type,
                              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    return reduce_scatter_(in, out, count, type, op, comm, stream);
  }
  ncclResult_t send(const void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return send_(buf, count, type, peer, comm, stream);
  }
  ncclResult_t recv(void* buf, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                    cudaStream_t stream) override {
    return recv_(buf, count, type, peer, comm, stream);
  }
  ncclResult_t group_start() override { return group_start_(); }
  ncclResult_t group_end() override { return group_end_(); }
  const char* error_string(ncclResult_t result) override { return error_string_(result); }

  cudaError_t stream_create(cudaStream_t* stream) override {
    // The highest priority: the reduction of a finished bucket should not queue behind backward's kernels.
    int least = 0, greatest = 0;
    if (const cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest); e != cudaSuccess) return e;
    return cudaStreamCreateWithPriority(stream, cudaStreamNonBlocking, greatest);
  }
  cudaError_t stream_destroy(cudaStream_t stream) override { return cudaStreamDestroy(stream); }
  cudaError_t event_create(cudaEvent_t* event) override {
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  }
  cudaError_t event_record(cudaEvent_t event, cudaStream_t stream) override {
    return cudaEventRecord(event, stream);
  }
  cudaError_t event_query(cudaEvent_t event) override { return cudaEventQuery(event); }
  cudaError_t event_destroy(cudaEvent_t event) override { return cudaEventDestroy(event); }
  cudaError_t stream_wait_event(cudaStream_t stream, cudaEvent_t event) override {
    return cudaStreamWaitEvent(stream, event, 0);
  }
  cudaError_t device_alloc(void** ptr, std::size_t bytes) override { return cudaMalloc(ptr, bytes); }
  cudaError_t device_free(void* ptr) override { return cudaFree(ptr); }
  cudaError_t memset_async(void* ptr, int value, std::size_t bytes, cudaStream_t stream) override {
    return cudaMemsetAsync(ptr, value, bytes, stream);
  }
  const char* cuda_error_string(cudaError_t error) override { return cudaGetErrorString(error); }

 private:
  template <class F>
  void resolve(F*& fn, const char* symbol) {
    dlerror();  // clear a stale error
    void* p = dlsym(handle_, symbol);
    if (p == nullptr) {
      const char* why = dlerror();
      SINEW_THROW(InvalidArgument, "{} has no {} ({}); Sinew needs NCCL 2.14 or later", path_, symbol,
                  why != nullptr ? why : "null symbol");
    }
    fn = reinterpret_cast<F*>(p);
  }

  std::string path_;
  void* handle_ = nullptr;
  int version_ = 0;
  ncclResult_t (*get_version_)(int*) = nullptr;
  ncclResult_t (*get_unique_id_)(ncclUniqueId*) = nullptr;
  ncclResult_t (*comm_init_rank_config_)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*comm_get_async_error_)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*comm_abort_)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_finalize_)(ncclComm_t) = nullptr;
  ncclResult_t (*comm_destroy_)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce_)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t) = nullptr;
  ncclResult_t (*broadcast_)(const void*, void*, std::size_t, ncclDataType_t, int, ncclComm_t,
                             cudaStream_t) = nullptr;
  ncclResult_t (*all_gather_)(const void*, void*, std::size_t, ncclDataType_t, ncclComm_t,
                              cudaStream_t) = nullptr;
  ncclResult_t (*reduce_)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                          cudaStream_t) = nullptr;
  ncclResult_t (*reduce_scatter_)(const void*, void*, std::size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                  cudaStream_t) = nullptr;
  ncclResult_t (*send_)(const void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*recv_)(void*, std::size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start_)() = nullptr;
  ncclResult_t (*group_end_)() = nullptr;
  const char* (*error_string_)(ncclResult_t) = nullptr;
};

}  // namespace

Api& real_api() {
  // Loaded once on success; after a failure (no NCCL) the next call tries again and throws again.
  static std::mutex mu;
  static RealApi* api = nullptr;
  const std::lock_guard lock(mu);
  if (api == nullptr) api = new RealApi();  // never deleted: see ~RealApi
  return *api;
}

}  // namespace sinew::comm::nccl
