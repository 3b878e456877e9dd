#include "sinew/mpi/communicator.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "sinew/mpi/check.hpp"

namespace sinew::mpi {

namespace {
bool predefined(MPI_Comm comm) {
  return comm == MPI_COMM_WORLD || comm == MPI_COMM_SELF || comm == MPI_COMM_NULL;
}
}  // namespace

Communicator::Communicator(MPI_Comm comm) : comm_(comm), owned_(!predefined(comm)) {
  if (comm_ != MPI_COMM_NULL) SINEW_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
}

Communicator Communicator::borrow(MPI_Comm comm) {
  Communicator c;
  c.comm_ = comm;
  c.owned_ = false;
  if (comm != MPI_COMM_NULL) SINEW_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return c;
}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    destroy();
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    owned_ = std::exchange(other.owned_, false);
  }
  return *this;
}

void complete_or_cancel(MPI_Request& req, std::chrono::milliseconds bound) noexcept {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (req != MPI_REQUEST_NULL) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0) return;
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (req == MPI_REQUEST_NULL) return;
  MPI_Cancel(&req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
}

Communicator Communicator::dup() const {
  MPI_Comm out = MPI_COMM_NULL;
  SINEW_MPI(MPI_Comm_dup(comm_, &out));
  return Communicator(out);
}

int Communicator::rank() const {
  int r = -1;
  SINEW_MPI(MPI_Comm_rank(comm_, &r));
  return r;
}

int Communicator::size() const {
  int s = 0;
  SINEW_MPI(MPI_Comm_size(comm_, &s));
  return s;
}

void Communicator::destroy() noexcept {
  if (owned_ && comm_ != MPI_COMM_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      const int rc = MPI_Comm_free(&comm_);
      if (rc != MPI_SUCCESS) spdlog::warn("MPI_Comm_free failed: {}", error_string(rc));
    }
  }
  comm_ = MPI_COMM_NULL;
  owned_ = false;
}

Datatype Datatype::contiguous(int count, MPI_Datatype base) {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  SINEW_MPI(MPI_Type_contiguous(count, base, &t));
  Datatype out(t);
  SINEW_MPI(MPI_Type_commit(&out.type_));
  return out;
}

void Datatype::reset() noexcept {
  if (type_ != MPI_DATATYPE_NULL) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Type_free(&type_);
    type_ = MPI_DATATYPE_NULL;
  }
}

bool Request::test() {
  if (req_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  SINEW_MPI(MPI_Test(&req_, &done, MPI_STATUS_IGNORE));
  return done != 0;
}

void Request::reset() noexcept {
  if (req_ == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (p2p_) {
      MPI_Cancel(&req_);
      MPI_Request_free(&req_);
    } else {
      // Freeing or cancelling an active collective request is erroneous in MPI; it completes (with an
      // error) once the communicator is revoked or aborted, which is what owners do before dropping it.
      spdlog::debug("dropping an active collective MPI request");
    }
  }
  req_ = MPI_REQUEST_NULL;
}

}  // namespace sinew::mpi
