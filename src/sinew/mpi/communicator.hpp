// RAII ownership of MPI handles (HighFive style): copies are deleted, a move leaves the source empty
// (MPI_COMM_NULL), destructors are noexcept and log instead of throwing.
#pragma once

#include <mpi.h>

#include <chrono>
#include <utility>

namespace sinew::mpi {

/// Owns an MPI communicator (never MPI_COMM_WORLD/SELF, which are only borrowed).
class Communicator {
 public:
  Communicator() = default;
  /// Takes ownership of `comm` (freed on destruction unless it is a predefined communicator) and sets
  /// MPI_ERRORS_RETURN on it so that failures become exceptions, not aborts.
  explicit Communicator(MPI_Comm comm);
  /// Borrows `comm` without owning it.
  static Communicator borrow(MPI_Comm comm);

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  Communicator(Communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)), owned_(std::exchange(other.owned_, false)) {}
  Communicator& operator=(Communicator&& other) noexcept;
  ~Communicator() { destroy(); }

  /// MPI_Comm_dup: a new communicator over the same group, with its own message space.
  [[nodiscard]] Communicator dup() const;

  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  [[nodiscard]] MPI_Comm get() const noexcept { return comm_; }
  [[nodiscard]] bool valid() const noexcept { return comm_ != MPI_COMM_NULL; }

  /// Frees the communicator (collective over its group). Safe to call twice; never throws.
  void destroy() noexcept;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;
};

/// Completes a point-to-point request within `bound` (polling), else cancels it and waits for the
/// cancellation; errors are ignored. For requests whose outcome does not matter (a heartbeat, a notice to a
/// process that may have died): never MPI_Request_free them while pending, since a send that fails after
/// it has nobody to report to (Open MPI 5.0.7 then ended the job with exit code 255 in our runs).
void complete_or_cancel(MPI_Request& req, std::chrono::milliseconds bound) noexcept;

/// Owns a committed MPI datatype.
class Datatype {
 public:
  Datatype() = default;
  explicit Datatype(MPI_Datatype type) : type_(type) {}
  /// A contiguous block of `count` elements of `base`, committed.
  static Datatype contiguous(int count, MPI_Datatype base);
  Datatype(const Datatype&) = delete;
  Datatype& operator=(const Datatype&) = delete;
  Datatype(Datatype&& other) noexcept : type_(std::exchange(other.type_, MPI_DATATYPE_NULL)) {}
  Datatype& operator=(Datatype&& other) noexcept {
    if (this != &other) {
      reset();
      type_ = std::exchange(other.type_, MPI_DATATYPE_NULL);
    }
    return *this;
  }
  ~Datatype() { reset(); }
  [[nodiscard]] MPI_Datatype get() const noexcept { return type_; }
  void reset() noexcept;

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

/// Owns a pending MPI request: the destructor of a still-active request cancels it instead of leaking it
/// (a request cannot be freed safely while its buffer may still be written).
class Request {
 public:
  Request() = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  Request(Request&& other) noexcept : req_(std::exchange(other.req_, MPI_REQUEST_NULL)), p2p_(other.p2p_) {}
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      reset();
      req_ = std::exchange(other.req_, MPI_REQUEST_NULL);
      p2p_ = other.p2p_;
    }
    return *this;
  }
  ~Request() { reset(); }

  /// Where MPI writes the handle of a point-to-point request (cancelled if dropped while active).
  MPI_Request* out_p2p() noexcept {
    p2p_ = true;
    return &req_;
  }
  /// Where MPI writes the handle of a nonblocking collective (which MPI does not let us cancel).
  MPI_Request* out_collective() noexcept {
    p2p_ = false;
    return &req_;
  }
  [[nodiscard]] bool active() const noexcept { return req_ != MPI_REQUEST_NULL; }
  /// Whether the handle came from out_collective(): MPI cannot cancel it.
  [[nodiscard]] bool collective() const noexcept { return !p2p_; }
  /// MPI_Test; true once complete (then the handle is MPI_REQUEST_NULL). Throws on failure.
  bool test();
  /// Cancels (point-to-point only) and frees the request. Never throws.
  void reset() noexcept;

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool p2p_ = false;
};

}  // namespace sinew::mpi
