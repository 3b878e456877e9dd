#include "sinew/serve/teacher_client.hpp"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <utility>

#include "teacher.grpc.pb.h"

namespace sinew::serve {

namespace {

// Logits travel as raw float32 bytes, little-endian by the protocol: this host's own order.
static_assert(std::endian::native == std::endian::little, "teacher.proto's logits are little-endian float32");

/// `deadline` as gRPC takes it. gRPC's own clock is not steady_clock, so the time left is what carries
/// over; a deadline already past stays past (the call then fails at once with DEADLINE_EXCEEDED).
gpr_timespec to_grpc(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (deadline <= now)
    return gpr_time_sub(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(1, GPR_TIMESPAN));
  const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
  // Beyond a day: no deadline to speak of (and no overflow from a time_point::max()).
  if (left > std::int64_t{86400} * 1000000000) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(left, GPR_TIMESPAN));
}

/// What to do about a failed call, for the message.
std::string_view hint(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
      return "; the teacher is not running or not reachable there";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "; the teacher is overloaded or hung (more teachers, or a longer deadline)";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "; teacher and student must have the same job token (--token-file or SINEW_JOB_TOKEN)";
    default:
      return "";
  }
}

}  // namespace

std::string_view rpc_code_name(RpcCode code) noexcept {
  switch (code) {
    case RpcCode::kOk:
      return "OK";
    case RpcCode::kCancelled:
      return "CANCELLED";
    case RpcCode::kUnknown:
      return "UNKNOWN";
    case RpcCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case RpcCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case RpcCode::kNotFound:
      return "NOT_FOUND";
    case RpcCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case RpcCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case RpcCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case RpcCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case RpcCode::kAborted:
      return "ABORTED";
    case RpcCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case RpcCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case RpcCode::kInternal:
      return "INTERNAL";
    case RpcCode::kUnavailable:
      return "UNAVAILABLE";
    case RpcCode::kDataLoss:
      return "DATA_LOSS";
    case RpcCode::kUnauthenticated:
      return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

struct TeacherClient::Impl {
  std::string address;
  std::string token;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<rpc::Teacher::Stub> stub;

  void prepare(grpc::ClientContext& ctx, Clock::time_point deadline) const {
    ctx.set_deadline(to_grpc(deadline));
    ctx.AddMetadata("x-sinew-token", token);
  }

  [[noreturn]] void fail(const char* call, const grpc::Status& s) const {
    const auto code = static_cast<RpcCode>(s.error_code());
    throw TeacherError(
        fmt::format("teacher {}: {} failed: {}: {}{}", address, call, rpc_code_name(code),
                    s.error_message().empty() ? "(no message)" : s.error_message(), hint(s.error_code())),
        SourceLocation::current(), code);
  }

  [[noreturn]] void malformed(const std::string& what) const {
    throw TeacherError(fmt::format("teacher {}: Infer: malformed reply: {}; is that a Sinew teacher of this "
                                   "version?",
                                   address, what),
                       SourceLocation::current(), RpcCode::kDataLoss);
  }
};

TeacherClient::TeacherClient(std::string address, std::string token) : impl_(std::make_unique<Impl>()) {
  impl_->address = std::move(address);
  impl_->token = std::move(token);
  grpc::ChannelArguments args;
  // A reply is classes x samples floats: as large as the teacher's limits make it, not gRPC's 4 MB default.
  args.SetMaxReceiveMessageSize(-1);
  // A broken connection is retried soon: a teacher that was briefly unreachable is used again within
  // about a second, not after gRPC's default backoff of up to two minutes. Calls in between fail at once
  // (UNAVAILABLE), and the student asks another teacher. gRPC core also takes the *minimum* backoff as
  // the minimum time it gives one connection attempt (its MIN_CONNECT_TIMEOUT, doc/connection-backoff.md):
  // at 100 ms, a TCP + HTTP/2 handshake on a loaded machine was abandoned ("tcp handshaker shutdown",
  // 3 of 100 runs of serve.teacher with two busy loops on two cores); 2 s lets a slow handshake finish and
  // still gives up on an unreachable host long before a call's own deadline would matter twice.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Plaintext, as MPI's own traffic: teachers and students run on one trusted cluster network.
  impl_->channel = grpc::CreateCustomChannel(impl_->address, grpc::InsecureChannelCredentials(), args);
  impl_->stub = rpc::Teacher::NewStub(impl_->channel);
}

TeacherClient::~TeacherClient() = default;
TeacherClient::TeacherClient(TeacherClient&&) noexcept = default;
TeacherClient& TeacherClient::operator=(TeacherClient&&) noexcept = default;

const std::string& TeacherClient::address() const { return impl_->address; }

TeacherInfo TeacherClient::info(Clock::time_point deadline) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx, deadline);
  rpc::InfoRequest req;
  rpc::InfoReply reply;
  const auto status = impl_->stub->Info(&ctx, req, &reply);
  if (!status.ok()) impl_->fail("Info", status);
  TeacherInfo i;
  i.id = reply.id();
  i.address = impl_->address;
  i.model = reply.model();
  i.dataset = reply.dataset();
  i.classes = static_cast<int>(reply.classes());
  i.train_size = reply.train_size();
  i.samples_per_s = reply.samples_per_s();
  i.max_request_samples = reply.max_request_samples();
  i.checkpoint_step = reply.checkpoint_step();
  i.requests = reply.requests();
  i.forward_passes = reply.forward_passes();
  return i;
}

void TeacherClient::infer(std::span<const std::size_t> indices, const std::string& dataset,
                          Clock::time_point deadline, std::vector<float>& out, int& classes) {
  grpc::ClientContext ctx;
  impl_->prepare(ctx, deadline);
  rpc::InferRequest req;
  req.set_dataset(dataset);
  auto& ids = *req.mutable_indices();
  ids.Reserve(static_cast<int>(indices.size()));
  for (const auto i : indices) ids.AddAlreadyReserved(i);
  rpc::InferReply reply;
  const auto status = impl_->stub->Infer(&ctx, req, &reply);
  if (!status.ok()) impl_->fail("Infer", status);
  if (reply.count() != indices.size()) {
    impl_->malformed(fmt::format("{} columns for {} samples", reply.count(), indices.size()));
  }
  // At most 2^20 classes: a bound that no classifier reaches and that keeps the product below overflow.
  if (reply.classes() == 0 || reply.classes() > (1u << 20)) {
    impl_->malformed(fmt::format("{} classes", reply.classes()));
  }
  const std::size_t values = std::size_t{reply.classes()} * indices.size();
  if (reply.logits().size() != values * sizeof(float)) {
    impl_->malformed(fmt::format("{} bytes of logits for {} classes x {} samples (expected {})",
                                 reply.logits().size(), reply.classes(), indices.size(),
                                 values * sizeof(float)));
  }
  out.resize(values);
  std::memcpy(out.data(), reply.logits().data(), values * sizeof(float));
  classes = static_cast<int>(reply.classes());
}

}  // namespace sinew::serve
