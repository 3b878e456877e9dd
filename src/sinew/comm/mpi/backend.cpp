#include "sinew/comm/mpi/backend.hpp"

#include <spdlog/spdlog.h>

#include <limits>
#include <thread>
#include <vector>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"
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

/// One or two MPI requests polled against a deadline. Polling first spins (latency of small messages),
/// then yields the core (ranks often share cores with each other and with the compute thread).
class MpiWork final : public Work {
 public:
  MpiWork(std::string what, std::vector<Request> reqs) : what_(std::move(what)), reqs_(std::move(reqs)) {}

  bool test() override {
    bool all = true;
    for (auto& r : reqs_) all = r.test() && all;
    return all;
  }

  void wait(std::chrono::milliseconds timeout) override {
    const auto start = Clock::now(), deadline = start + timeout;
    for (int spins = 0;; ++spins) {
      if (test()) return;
      if (spins > 64) {
        const auto now = Clock::now();
        if (now > deadline) {
          SINEW_THROW(Timeout, "{} did not complete within {} ms; a peer is dead, stopped or far behind",
                      what_, timeout.count());
        }
        // A long wait (a slow link, a peer still computing) polls less often, leaving the core to the
        // ranks and threads that share it; a short one stays responsive.
        if (now - start > std::chrono::milliseconds(2)) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        } else {
          std::this_thread::yield();
        }
      }
    }
  }

 private:
  std::string what_;
  std::vector<Request> reqs_;
};

std::unique_ptr<Work> one(std::string what, Request r) {
  std::vector<Request> v;
  v.push_back(std::move(r));
  return std::make_unique<MpiWork>(std::move(what), std::move(v));
}

}  // namespace

MpiBackend::MpiBackend(const sinew::mpi::Communicator& comm) : comm_(comm.dup()) {
  rank_ = comm_.rank();
  size_ = comm_.size();
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
  return one(fmt::format("allreduce({} x {})", buf.count, dtype_name(buf.dtype)), std::move(r));
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
  return one(fmt::format("broadcast({} x {} from {})", buf.count, dtype_name(buf.dtype), root), std::move(r));
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
  return one(fmt::format("allgather({} x {})", in.count, dtype_name(in.dtype)), std::move(r));
}

std::unique_ptr<Work> MpiBackend::send(Buffer buf, int peer, const Options& opts) {
  check_usable();
  check_peer(peer, "send");
  Request r;
  SINEW_MPI(MPI_Isend(buf.data, checked_count(buf.count, "send"), to_mpi(buf.dtype), peer, opts.tag,
                      comm_.get(), r.out_p2p()));
  return one(fmt::format("send({} x {} to {})", buf.count, dtype_name(buf.dtype), peer), std::move(r));
}

std::unique_ptr<Work> MpiBackend::recv(Buffer buf, int peer, const Options& opts) {
  check_usable();
  check_peer(peer, "recv");
  Request r;
  SINEW_MPI(MPI_Irecv(buf.data, checked_count(buf.count, "recv"), to_mpi(buf.dtype), peer, opts.tag,
                      comm_.get(), r.out_p2p()));
  return one(fmt::format("recv({} x {} from {})", buf.count, dtype_name(buf.dtype), peer), std::move(r));
}

std::unique_ptr<Work> MpiBackend::barrier(const Options&) {
  check_usable();
  Request r;
  SINEW_MPI(MPI_Ibarrier(comm_.get(), r.out_collective()));
  return one("barrier", std::move(r));
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
