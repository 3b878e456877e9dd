// The client of one teacher of the distillation service (teacher.proto): a student asks it for the logits of
// training samples by index. gRPC stays behind the pimpl: this header needs neither gRPC nor the generated
// code.
//
// Every call carries the job token (metadata "x-sinew-token") and a deadline. A failed call throws
// TeacherError (a ServiceError: exit code 6) that names the teacher's address, the gRPC status code and the
// teacher's message, with the code itself for the caller to act on (UNAVAILABLE: the teacher is gone, try
// another; FAILED_PRECONDITION: it serves other data, never ask it again; ...).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sinew/core/error.hpp"

namespace sinew::serve {

using Clock = std::chrono::steady_clock;

/// What a teacher serves (the Info call), and where.
struct TeacherInfo {
  std::string id;       ///< unique per teacher process: "host:pid:port"
  std::string address;  ///< where it listens ("host:port"): the client's address, or the server's own
  std::string model;    ///< the model spec, e.g. "mlp:128"
  std::string dataset;  ///< the fingerprint of its training data (data::fingerprint)
  int classes = 0;
  std::uint64_t train_size = 0;
  double samples_per_s = 0;  ///< measured over recent forward passes (compute time only); 0 before the first
  std::size_t max_request_samples = 0;
  std::int64_t checkpoint_step = 0;
  std::uint64_t requests = 0;        ///< Infer requests answered with logits since the teacher started
  std::uint64_t forward_passes = 0;  ///< forward passes that computed them (fewer: requests were merged)
};

/// The gRPC status codes, same numbers (grpc::StatusCode), so that callers need no gRPC header.
enum class RpcCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,  ///< also: the teacher's reply was malformed (wrong byte count, count or classes)
  kUnauthenticated = 16,
};

/// "UNAVAILABLE", "DEADLINE_EXCEEDED", ... (as gRPC spells them).
[[nodiscard]] std::string_view rpc_code_name(RpcCode code) noexcept;

/// A call to a teacher failed.
class TeacherError : public ServiceError {
 public:
  TeacherError(std::string_view what, const SourceLocation& where, RpcCode code)
      : ServiceError(what, where), code_(code) {}
  [[nodiscard]] RpcCode code() const noexcept { return code_; }

 private:
  RpcCode code_;
};

/// One teacher, over one channel (HTTP/2 connection, re-established when it breaks). Thread-safe: any
/// number of calls may be in flight at once.
class TeacherClient {
 public:
  /// `address`: "host:port" of a teacher; `token`: the job token. Connects lazily, on the first call.
  TeacherClient(std::string address, std::string token);
  ~TeacherClient();
  TeacherClient(TeacherClient&&) noexcept;
  TeacherClient& operator=(TeacherClient&&) noexcept;
  TeacherClient(const TeacherClient&) = delete;
  TeacherClient& operator=(const TeacherClient&) = delete;

  /// What the teacher serves. `address` is this client's. Throws TeacherError.
  TeacherInfo info(Clock::time_point deadline);

  /// The logits of training samples `indices` (at most the teacher's max_request_samples, each < its
  /// train_size) into `out`, classes x indices.size() column-major (resized), and the class count into
  /// `classes`. `dataset`: the student's data set fingerprint, which must equal the teacher's. Throws
  /// TeacherError naming the address, the gRPC status code and message (DEADLINE_EXCEEDED, UNAVAILABLE,
  /// UNAUTHENTICATED, FAILED_PRECONDITION, INVALID_ARGUMENT, ...), or DATA_LOSS on a malformed reply.
  void infer(std::span<const std::size_t> indices, const std::string& dataset, Clock::time_point deadline,
             std::vector<float>& out, int& classes);

  [[nodiscard]] const std::string& address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::serve
