#include "sinew/comm/mpi/backend.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <mutex>
#include <vector>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/mpi/check.hpp"
#include "sinew/mpi/environment.hpp"
#if SINEW_HAVE_ULFM
#include <mpi-ext.h>
#endif

namespace sinew::comm::mpi {

using sinew::mpi::Request;

MPI_Datatype to_mpi(DType t) {
  switch (t) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUInt64:
      return MPI_UINT64_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
  }
  SINEW_THROW(InvalidArgument, "mpi backend: unknown dtype {}", static_cast<int>(t));
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  SINEW_THROW(InvalidArgument, "mpi backend: unknown reduce op {}", static_cast<int>(op));
}

namespace {

int checked_count(std::size_t count, const char* op) {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    SINEW_THROW(InvalidArgument, "mpi backend: {} of {} elements exceeds MPI's int count; split the buffer",
                op, count);
  }
  return static_cast<int>(count);
}

/// MPI requests polled against a deadline (comm::poll_until_complete). A mutex keeps abort() from
/// another thread off the request handles while test() uses them; the flag lets a waiting thread see the
/// abort without taking the mutex.
class MpiWork final : public Work {
 public:
  /// `backend`: the communicator's; aborted when a collective of this operation is aborted unfinished
  /// (point-to-point operations MPI cancels one by one).
  /// `keep`: what MPI reads until the requests complete (the counts and displacements of a -v collective).
  MpiWork(std::string what, std::vector<Request> reqs, MpiBackend& backend, std::vector<int> keep = {})
      : what_(std::move(what)), reqs_(std::move(reqs)), backend_(backend), keep_(std::move(keep)) {}
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;
  MpiWork(MpiWork&&) = delete;
  MpiWork& operator=(MpiWork&&) = delete;
  ~MpiWork() override = default;

  bool test() override {
    check_not_aborted();
    std::lock_guard lock(mu_);
    check_not_aborted();  // aborted while this thread waited for the mutex: the requests are gone
    bool all = true;
    try {
      for (auto& r : reqs_) all = r.test() && all;
    } catch (const CommFailure&) {
      throw;
    } catch (const Error& e) {
      // Open MPI 5.0.7's nonblocking collectives (libnbc) report a failed peer or a revocation met while
      // starting a later round of their schedule as MPI_ERR_OTHER ("Error in NBC_Start_round()"), not as
      // ULFM's error classes: when this communicator knows of a failure, that is what the error is.
      if (backend_.revoked() || backend_.failed_peers() > 0) {
        SINEW_THROW(CommFailure, "{} (the communicator has a failed peer or was revoked)", e.message());
      }
      throw;
    }
    return all;
  }

  void wait(std::chrono::milliseconds timeout) override { poll_until_complete(*this, timeout, what_); }

  void abort() noexcept override {
    if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
    bool unfinished_collective = false;
    try {
      std::lock_guard lock(mu_);
      for (auto& r : reqs_) {
        if (r.collective()) {
          unfinished_collective = unfinished_collective || r.active();
        } else {
          r.reset();  // MPI_Cancel + MPI_Request_free: an unmatched receive is cancelled at once
        }
      }
    } catch (...) {  // std::mutex::lock: only on a broken invariant; give the group up to be safe
      unfinished_collective =
          std::any_of(reqs_.begin(), reqs_.end(), [](const Request& r) { return r.collective(); });
    }
    // An unfinished collective stays in MPI's queue: only aborting the communicator ends it (here, with
    // ULFM, and at the peers); its requests then complete with an error and are dropped with the Work.
    if (unfinished_collective) backend_.abort();
  }

 private:
  void check_not_aborted() const {
    if (aborted_.load(std::memory_order_acquire)) SINEW_THROW(CommFailure, "{} was aborted", what_);
  }

  std::string what_;
  std::mutex mu_;
  std::vector<Request> reqs_;  // guarded by mu_
  MpiBackend& backend_;
  std::vector<int> keep_;
  std::atomic<bool> aborted_{false};
};

std::unique_ptr<Work> one(std::string what, Request r, MpiBackend& backend, std::vector<int> keep = {}) {
  std::vector<Request> v;
  v.push_back(std::move(r));
  return std::make_unique<MpiWork>(std::move(what), std::move(v), backend, std::move(keep));
}

/// MPI's counts and displacements of `size` blocks of `counts` (ints, checked), in one vector: counts first.
std::vector<int> blocks(std::span<const std::size_t> counts, int size, std::size_t total, const char* op) {
  if (counts.size() != static_cast<std::size_t>(size)) {
    SINEW_THROW(InvalidArgument, "mpi backend: {} of {} blocks over {} ranks", op, counts.size(), size);
  }
  std::vector<int> v(2 * counts.size());
  std::size_t at = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    v[i] = checked_count(counts[i], op);
    v[counts.size() + i] = checked_count(at, op);
    at += counts[i];
  }
  if (at != total) {
    SINEW_THROW(InvalidArgument, "mpi backend: {} of blocks summing to {} over a buffer of {} elements", op,
                at, total);
  }
  return v;
}

}  // namespace

MpiBackend::MpiBackend(const sinew::mpi::Communicator& comm) : comm_(comm.dup()) {
  rank_ = comm_.rank();
  size_ = comm_.size();
  ulfm_ = sinew::mpi::ulfm_enabled();
}

void MpiBackend::check_usable() const {
  if (aborted_.load(std::memory_order_acquire)) {
    SINEW_THROW(CommFailure, "mpi backend was aborted after a failure; rebuild the group before using it");
  }
}

void MpiBackend::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_) {
    SINEW_THROW(InvalidArgument, "mpi backend: {} peer {} is outside the group of {} ranks", op, peer, size_);
  }
}

std::unique_ptr<Work> MpiBackend::allreduce(Buffer buf, ReduceOp op, const Options&) {
  check_usable();
  Request r;
  SINEW_MPI(MPI_Iallreduce(MPI_IN_PLACE, buf.data, checked_count(buf.count, "allreduce"), to_mpi(buf.dtype),
                           to_mpi(op), comm_.get(), r.out_collective()));
  return one(fmt::format("allreduce({} x {})", buf.count, dtype_name(buf.dtype)), std::move(r), *this);
}

void MpiBackend::allreduce_blocking(Buffer buf, ReduceOp op) {
  check_usable();
  SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, buf.data, checked_count(buf.count, "allreduce"), to_mpi(buf.dtype),
                          to_mpi(op), comm_.get()));
}

std::unique_ptr<Work> MpiBackend::broadcast(Buffer buf, int root, const Options&) {
  check_usable();
  check_peer(root, "broadcast root");
  Request r;
  SINEW_MPI(MPI_Ibcast(buf.data, checked_count(buf.count, "broadcast"), to_mpi(buf.dtype), root, comm_.get(),
                       r.out_collective()));
  return one(fmt::format("broadcast({} x {} from {})", buf.count, dtype_name(buf.dtype), root), std::move(r),
             *this);
}

std::unique_ptr<Work> MpiBackend::allgather(Buffer in, Buffer out, const Options&) {
  check_usable();
  if (in.dtype != out.dtype || out.count != in.count * static_cast<std::size_t>(size_)) {
    SINEW_THROW(InvalidArgument,
                "mpi backend: allgather needs an output of {} x {} elements of {}, got {} of {}", size_,
                in.count, dtype_name(in.dtype), out.count, dtype_name(out.dtype));
  }
  Request r;
  const int n = checked_count(in.count, "allgather");
  SINEW_MPI(MPI_Iallgather(in.data, n, to_mpi(in.dtype), out.data, n, to_mpi(out.dtype), comm_.get(),
                           r.out_collective()));
  return one(fmt::format("allgather({} x {})", in.count, dtype_name(in.dtype)), std::move(r), *this);
}

std::unique_ptr<Work> MpiBackend::reduce_scatter(Buffer in, Buffer out, std::span<const std::size_t> counts,
                                                 ReduceOp op, const Options&) {
  check_usable();
  std::vector<int> c = blocks(counts, size_, in.count, "reduce_scatter");
  if (in.dtype != out.dtype || out.count != counts[static_cast<std::size_t>(rank_)]) {
    SINEW_THROW(
        InvalidArgument, "mpi backend: reduce_scatter needs an output of {} elements of {}, got {} of {}",
        counts[static_cast<std::size_t>(rank_)], dtype_name(in.dtype), out.count, dtype_name(out.dtype));
  }
  c.resize(counts.size());  // no displacements: MPI cuts the input by the counts alone
  Request r;
  SINEW_MPI(MPI_Ireduce_scatter(in.data, out.data, c.data(), to_mpi(in.dtype), to_mpi(op), comm_.get(),
                                r.out_collective()));
  return one(fmt::format("reduce_scatter({} x {})", in.count, dtype_name(in.dtype)), std::move(r), *this,
             std::move(c));
}

std::unique_ptr<Work> MpiBackend::allgather_v(Buffer buf, std::span<const std::size_t> counts,
                                              const Options&) {
  check_usable();
  std::vector<int> c = blocks(counts, size_, buf.count, "allgather_v");
  Request r;
  const int n = size_;
  SINEW_MPI(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data, c.data(), c.data() + n,
                            to_mpi(buf.dtype), comm_.get(), r.out_collective()));
  return one(fmt::format("allgather_v({} x {})", buf.count, dtype_name(buf.dtype)), std::move(r), *this,
             std::move(c));
}

std::unique_ptr<Work> MpiBackend::send(Buffer buf, int peer, const Options& opts) {
  check_usable();
  check_peer(peer, "send");
  Request r;
  SINEW_MPI(MPI_Isend(buf.data, checked_count(buf.count, "send"), to_mpi(buf.dtype), peer, opts.tag,
                      comm_.get(), r.out_p2p()));
  return one(fmt::format("send({} x {} to {})", buf.count, dtype_name(buf.dtype), peer), std::move(r), *this);
}

std::unique_ptr<Work> MpiBackend::recv(Buffer buf, int peer, const Options& opts) {
  check_usable();
  check_peer(peer, "recv");
  Request r;
  SINEW_MPI(MPI_Irecv(buf.data, checked_count(buf.count, "recv"), to_mpi(buf.dtype), peer, opts.tag,
                      comm_.get(), r.out_p2p()));
  return one(fmt::format("recv({} x {} from {})", buf.count, dtype_name(buf.dtype), peer), std::move(r),
             *this);
}

std::unique_ptr<Work> MpiBackend::barrier(const Options&) {
  check_usable();
  Request r;
  SINEW_MPI(MPI_Ibarrier(comm_.get(), r.out_collective()));
  return one("barrier", std::move(r), *this);
}

namespace {
/// A tag no Sinew message uses: the probe in failed_peers() only drives progress and must match nothing.
constexpr int kProgressProbeTag = 32766;  // below MPI's guaranteed MPI_TAG_UB (32767)
}  // namespace

int MpiBackend::failed_peers() const noexcept {
#if SINEW_HAVE_ULFM
  if (!ulfm_) return 0;
  // Failure notices are processed by MPI's progress engine, which nothing else drives while this process
  // waits outside MPI. The probe's result (an error once a failure is known) does not matter.
  int flag = 0;
  MPI_Iprobe(MPI_ANY_SOURCE, kProgressProbeTag, comm_.get(), &flag, MPI_STATUS_IGNORE);
  MPI_Group failed = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm_.get(), &failed) != MPI_SUCCESS) return 0;
  int n = 0;
  if (MPI_Group_size(failed, &n) != MPI_SUCCESS) n = 0;
  MPI_Group_free(&failed);
  return n;
#else
  return 0;
#endif
}

std::vector<int> MpiBackend::failed_ranks() const {
  std::vector<int> out;
#if SINEW_HAVE_ULFM
  if (!ulfm_) return out;
  MPI_Group failed = MPI_GROUP_NULL, all = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm_.get(), &failed) != MPI_SUCCESS) return out;
  int n = 0;
  if (MPI_Group_size(failed, &n) == MPI_SUCCESS && n > 0 &&
      MPI_Comm_group(comm_.get(), &all) == MPI_SUCCESS) {
    std::vector<int> in(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = i;
    out.assign(static_cast<std::size_t>(n), MPI_UNDEFINED);
    MPI_Group_translate_ranks(failed, n, in.data(), all, out.data());
    MPI_Group_free(&all);
    std::sort(out.begin(), out.end());
  }
  MPI_Group_free(&failed);
#endif
  return out;
}

bool MpiBackend::revoked() const noexcept {
#if SINEW_HAVE_ULFM
  if (!ulfm_) return false;
  int flag = 0;
  return MPIX_Comm_is_revoked(comm_.get(), &flag) == MPI_SUCCESS && flag != 0;
#else
  return false;
#endif
}

void MpiBackend::abort() noexcept {
  if (aborted_.exchange(true)) return;
#if SINEW_HAVE_ULFM
  try {
    if (sinew::mpi::ulfm_enabled()) {
      MPIX_Comm_revoke(comm_.get());
      return;
    }
  } catch (...) {
  }
#endif
  spdlog::warn("mpi backend aborted without ULFM: operations pending at peers cannot be interrupted");
}

}  // namespace sinew::comm::mpi
