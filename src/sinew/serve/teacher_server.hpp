// A teacher of the distillation service (teacher.proto, docs/distillation.md): one checkpoint's model,
// serving the logits of training samples by index over gRPC. gRPC stays behind the pimpl: this header
// needs neither gRPC nor the generated code.
//
// Requests are checked on gRPC's threads (token, data set fingerprint, indices) and queued; one inference
// thread owns the model (Model is not thread-safe), takes whatever is queued, whole requests up to
// max_batch samples (a larger request alone), runs one forward pass over all of them and answers each.
// Under load, concurrent students' requests thus share forward passes; alone, a request is computed at once.
// A request whose deadline passed while it waited is dropped unanswered by compute.
//
// Security: plaintext gRPC (InsecureServerCredentials), as MPI's own traffic, for a trusted cluster network.
// The job token keeps a student from using another job's teacher by mistake; it is no protection against
// an attacker on that network.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "sinew/serve/teacher_client.hpp"

namespace sinew::serve {

struct ServeOptions {
  std::string checkpoint;              ///< a checkpoint, or a checkpoint root (its newest committed one)
  std::string listen = "127.0.0.1:0";  ///< host:port; port 0 picks a free one (address() tells which)
  std::string token;                   ///< the job token; required, non-empty
  std::string data_dir;                ///< empty: the data directory the checkpoint's run used
  /// Larger requests are refused (INVALID_ARGUMENT); also bounds a request's size on the wire (gRPC's
  /// receive limit: a larger message is refused by gRPC, RESOURCE_EXHAUSTED, before it is parsed).
  std::size_t max_request_samples = 4096;
  std::size_t max_batch = 1024;  ///< samples of one merged forward pass (a single larger request: alone)
};

/// Loads the model and its data set and serves on construction; shuts down when destroyed.
class TeacherServer {
 public:
  /// Throws InvalidArgument for bad options (empty token, zero limits, a malformed listen address) or a
  /// model that does not fit the data, CheckpointError for an unusable checkpoint, DataError for missing
  /// data, ServiceError when it cannot listen on `listen` (address in use, not this host's).
  explicit TeacherServer(ServeOptions o);
  /// Shuts down (shutdown()) and waits for it.
  ~TeacherServer();
  TeacherServer(const TeacherServer&) = delete;
  TeacherServer& operator=(const TeacherServer&) = delete;
  TeacherServer(TeacherServer&&) = delete;
  TeacherServer& operator=(TeacherServer&&) = delete;

  /// Where students reach it: "host:port", the listen host (this host's name for a wildcard address such as
  /// 0.0.0.0) with the port chosen.
  [[nodiscard]] const std::string& address() const;
  /// What the Info call answers (with address()). A forward pass is counted (requests, forward_passes,
  /// samples_per_s) before its requests are answered: a caller whose infer() returned sees it here.
  [[nodiscard]] TeacherInfo info() const;
  /// The checkpoint served (resolved: a checkpoint directory, never a root).
  [[nodiscard]] const std::string& checkpoint() const;

  /// Blocks until shutdown() has completed.
  void wait();
  /// Stops serving: new calls are refused (UNAVAILABLE), calls in flight are answered (at most a few
  /// seconds, then cancelled), then the inference thread ends. From any thread; idempotent; concurrent
  /// callers all return once it is done.
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::serve
