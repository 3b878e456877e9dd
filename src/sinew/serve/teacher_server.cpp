#include "sinew/serve/teacher_server.hpp"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/distill/teacher_model.hpp"
#include "teacher.grpc.pb.h"

namespace sinew::serve {

namespace {

static_assert(std::endian::native == std::endian::little, "teacher.proto's logits are little-endian float32");

constexpr std::string_view kTokenKey = "x-sinew-token";
/// How long shutdown() lets calls in flight finish before gRPC cancels them.
constexpr auto kShutdownGrace = std::chrono::seconds(3);
/// Weight of the past in the throughput estimate, per forward pass: about the last ten passes count.
constexpr double kRateDecay = 0.9;
/// The most samples a request may ask for: keeps gRPC's receive limit (an int) far from overflow.
constexpr std::size_t kMaxRequestSamplesLimit = std::size_t{1} << 24;

/// Compares the token a call carries with the job's in time that depends only on the job token's length,
/// so that timing reveals nothing of how much of a guess was right.
bool token_matches(std::string_view given, std::string_view expected) {
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0u;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "localhost";
  return buf.data();
}

/// "host:port" split at the last ':' ("[::1]:0" has host "[::1]"); InvalidArgument when malformed.
std::pair<std::string, int> split_listen(const std::string& listen) {
  const auto colon = listen.rfind(':');
  const auto bad = [&] {
    SINEW_THROW(InvalidArgument,
                "listen address '{}': expected HOST:PORT, e.g. 0.0.0.0:0 (port 0: any free port)", listen);
  };
  if (colon == std::string::npos || colon + 1 == listen.size() || listen.size() - colon > 6) bad();
  int port = 0;
  for (std::size_t i = colon + 1; i < listen.size(); ++i) {
    if (listen[i] < '0' || listen[i] > '9') bad();
    port = port * 10 + (listen[i] - '0');
  }
  if (port > 65535) bad();
  return {listen.substr(0, colon), port};
}

bool wildcard(std::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "*";
}

}  // namespace

struct TeacherServer::Impl final : rpc::Teacher::CallbackService {
  /// An Infer call waiting for the inference thread. gRPC keeps the request, reply and context alive until
  /// the reactor is finished, which the inference thread does exactly once for each.
  struct Pending {
    grpc::CallbackServerContext* ctx = nullptr;
    grpc::ServerUnaryReactor* reactor = nullptr;
    const rpc::InferRequest* request = nullptr;
    rpc::InferReply* reply = nullptr;
    Clock::time_point queued;
  };

  ServeOptions opt;
  data::Dataset train;
  std::optional<distill::TeacherModel> model;
  std::string fingerprint;
  std::string address;
  std::string id;

  std::mutex mu;
  std::condition_variable wake;  // the inference thread: work queued, or stop
  std::deque<Pending> queue;
  bool stopping = false;      // refuse new calls
  bool stop_compute = false;  // the inference thread ends once the queue is empty
  std::thread worker;

  mutable std::mutex rate_mu;
  double decayed_samples = 0, decayed_seconds = 0;  // sums over forward passes, older ones decayed
  std::uint64_t requests = 0, forward_passes = 0;

  std::once_flag shutdown_once;
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;

  // Declared last: destroyed first, before the service it calls into.
  std::unique_ptr<grpc::Server> server;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;
  ~Impl() override {
    if (server) server->Shutdown(std::chrono::system_clock::now());  // only if shutdown() never ran
    stop_worker();
  }

  void stop_worker() {
    {
      const std::lock_guard lk(mu);
      stop_compute = true;
    }
    wake.notify_all();
    if (worker.joinable()) worker.join();
  }

  [[nodiscard]] bool authorized(const grpc::CallbackServerContext& ctx) const {
    const auto& md = ctx.client_metadata();
    const auto it = md.find(grpc::string_ref(kTokenKey.data(), kTokenKey.size()));
    if (it == md.end()) return false;
    return token_matches(std::string_view(it->second.data(), it->second.size()), opt.token);
  }

  static grpc::ServerUnaryReactor* finish(grpc::CallbackServerContext* ctx, grpc::StatusCode code,
                                          const std::string& message) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status(code, message));
    return reactor;
  }

  static grpc::ServerUnaryReactor* unauthenticated(grpc::CallbackServerContext* ctx) {
    return finish(
        ctx, grpc::StatusCode::UNAUTHENTICATED,
        "missing or wrong job token (metadata x-sinew-token): this teacher serves another job, or the "
        "token files differ");
  }

  grpc::ServerUnaryReactor* Infer(grpc::CallbackServerContext* ctx, const rpc::InferRequest* req,
                                  rpc::InferReply* reply) override {
    if (!authorized(*ctx)) return unauthenticated(ctx);
    if (req->dataset() != fingerprint) {
      return finish(
          ctx, grpc::StatusCode::FAILED_PRECONDITION,
          fmt::format("data set mismatch: the student's is {}, this teacher's is {}; both must load the "
                      "same training data (data set, data dir, --limit-train)",
                      req->dataset().empty() ? "(none given)" : req->dataset(), fingerprint));
    }
    const auto n = static_cast<std::size_t>(req->indices_size());
    if (n == 0) return finish(ctx, grpc::StatusCode::INVALID_ARGUMENT, "empty request: no sample indices");
    if (n > opt.max_request_samples) {
      return finish(ctx, grpc::StatusCode::INVALID_ARGUMENT,
                    fmt::format("{} samples in one request, this teacher takes at most {}; split it", n,
                                opt.max_request_samples));
    }
    for (const auto i : req->indices()) {
      if (i >= train.size()) {
        return finish(
            ctx, grpc::StatusCode::INVALID_ARGUMENT,
            fmt::format("sample index {} out of range: the training set has {} samples", i, train.size()));
      }
    }
    auto* reactor = ctx->DefaultReactor();
    {
      const std::lock_guard lk(mu);
      if (stopping) {
        reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the teacher is shutting down"));
        return reactor;
      }
      queue.push_back(Pending{ctx, reactor, req, reply, Clock::now()});
    }
    wake.notify_one();
    return reactor;
  }

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* ctx, const rpc::InfoRequest* /*req*/,
                                 rpc::InfoReply* reply) override {
    if (!authorized(*ctx)) return unauthenticated(ctx);
    const auto i = info();
    reply->set_id(i.id);
    reply->set_model(i.model);
    reply->set_classes(static_cast<std::uint32_t>(i.classes));
    reply->set_dataset(i.dataset);
    reply->set_train_size(i.train_size);
    reply->set_samples_per_s(i.samples_per_s);
    reply->set_max_request_samples(i.max_request_samples);
    reply->set_checkpoint_step(i.checkpoint_step);
    reply->set_requests(i.requests);
    reply->set_forward_passes(i.forward_passes);
    return finish(ctx, grpc::StatusCode::OK, "");
  }

  [[nodiscard]] TeacherInfo info() const {
    TeacherInfo i;
    i.id = id;
    i.address = address;
    i.model = model->spec();
    i.dataset = fingerprint;
    i.classes = model->classes();
    i.train_size = train.size();
    {
      const std::lock_guard lk(rate_mu);
      i.samples_per_s = decayed_seconds > 0 ? decayed_samples / decayed_seconds : 0;
      i.requests = requests;
      i.forward_passes = forward_passes;
    }
    i.max_request_samples = opt.max_request_samples;
    i.checkpoint_step = model->step();
    return i;
  }

  /// The inference thread: takes whole requests off the queue, up to max_batch samples (a larger request
  /// alone), and answers them with one forward pass.
  void run() {
    std::vector<Pending> batch;
    std::vector<std::size_t> indices;
    std::vector<float> logits;
    std::unique_lock lk(mu);
    while (true) {
      wake.wait(lk, [&] { return stop_compute || !queue.empty(); });
      if (queue.empty()) return;  // stop_compute, and nothing left to answer
      batch.clear();
      std::size_t n = 0;
      while (!queue.empty()) {
        const auto size = static_cast<std::size_t>(queue.front().request->indices_size());
        if (!batch.empty() && n + size > opt.max_batch) break;
        n += size;
        batch.push_back(queue.front());
        queue.pop_front();
      }
      lk.unlock();
      compute(batch, indices, logits);
      lk.lock();
    }
  }

  void compute(std::vector<Pending>& batch, std::vector<std::size_t>& indices, std::vector<float>& logits) {
    // Work nobody waits for any more is not computed: under overload that is what lets the queue drain.
    const auto now = std::chrono::system_clock::now();
    std::erase_if(batch, [&](const Pending& p) {
      if (!p.ctx->IsCancelled() && p.ctx->deadline() > now) return false;
      const auto waited = std::chrono::duration<double, std::milli>(Clock::now() - p.queued).count();
      p.reactor->Finish(
          grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       fmt::format("deadline passed after {:.0f} ms in the teacher's queue", waited)));
      return true;
    });
    if (batch.empty()) return;
    indices.clear();
    for (const auto& p : batch)
      indices.insert(indices.end(), p.request->indices().begin(), p.request->indices().end());
    const auto t0 = Clock::now();
    try {
      model->logits(train, indices, logits);
    } catch (const std::exception& e) {
      // The indices were checked: only a bug (or memory) gets here. Each caller hears of it; the server
      // lives.
      spdlog::error("teacher: forward pass of {} samples failed: {}", indices.size(), e.what());
      for (const auto& p : batch) p.reactor->Finish(grpc::Status(grpc::StatusCode::INTERNAL, e.what()));
      return;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // Counted before any reply goes out: a student that got its logits and then asks Info (or reads the
    // registry, which publishes info()) must see this pass in the statistics.
    {
      const std::lock_guard lk(rate_mu);
      decayed_samples = kRateDecay * decayed_samples + static_cast<double>(indices.size());
      decayed_seconds = kRateDecay * decayed_seconds + seconds;
      requests += batch.size();
      ++forward_passes;
    }
    const auto classes = static_cast<std::size_t>(model->classes());
    std::size_t column = 0;
    for (const auto& p : batch) {
      const auto count = static_cast<std::size_t>(p.request->indices_size());
      p.reply->set_classes(static_cast<std::uint32_t>(classes));
      p.reply->set_count(static_cast<std::uint32_t>(count));
      p.reply->set_logits(reinterpret_cast<const char*>(logits.data() + column * classes),  // NOLINT
                          count * classes * sizeof(float));
      p.reply->set_compute_ms(seconds * 1e3);
      p.reactor->Finish(grpc::Status::OK);
      column += count;
    }
  }
};

TeacherServer::TeacherServer(ServeOptions o) : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.opt = std::move(o);
  if (s.opt.token.empty()) {
    SINEW_THROW(InvalidArgument,
                "the teacher needs the job token (--token-file F or SINEW_JOB_TOKEN); its "
                "students use the same one");
  }
  if (s.opt.max_request_samples == 0 || s.opt.max_request_samples > kMaxRequestSamplesLimit) {
    SINEW_THROW(InvalidArgument, "max request samples must be in [1, {}], got {}", kMaxRequestSamplesLimit,
                s.opt.max_request_samples);
  }
  if (s.opt.max_batch == 0) SINEW_THROW(InvalidArgument, "max batch must be at least 1 sample");
  const auto [host, port] = split_listen(s.opt.listen);
  (void)port;

  auto data_options = distill::TeacherModel::dataset_options(s.opt.checkpoint);
  if (!s.opt.data_dir.empty()) data_options.data_dir = s.opt.data_dir;
  s.train = data::load_dataset(data_options).train;
  s.model.emplace(distill::TeacherModel::load(s.opt.checkpoint, s.train));
  s.fingerprint = data::fingerprint(s.train);

  s.worker = std::thread([&s] { s.run(); });

  grpc::ServerBuilder builder;
  int selected = 0;
  builder.AddListeningPort(s.opt.listen, grpc::InsecureServerCredentials(), &selected);
  // Two teachers given the same port must not share it silently (gRPC sets SO_REUSEPORT by default).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A request is the fingerprint and at most max_request_samples varints of at most 10 bytes each; any
  // larger message is refused by gRPC before it is parsed.
  builder.SetMaxReceiveMessageSize(static_cast<int>(10 * s.opt.max_request_samples + 4096));
  builder.RegisterService(&s);
  s.server = builder.BuildAndStart();
  if (!s.server || selected == 0) {
    SINEW_THROW(ServiceError,
                "the teacher cannot listen on {} (the port is in use, or the host is not an "
                "address of this machine); choose another --listen",
                s.opt.listen);
  }
  s.address = fmt::format("{}:{}", wildcard(host) ? host_name() : host, selected);
  s.id = fmt::format("{}:{}:{}", host_name(), ::getpid(), selected);
  spdlog::info("teacher {}: model {} (step {}) of {}, data set {} ({} training samples), on {}", s.id,
               s.model->spec(), s.model->step(), s.model->path(), s.fingerprint, s.train.size(), s.address);
}

TeacherServer::~TeacherServer() { shutdown(); }

const std::string& TeacherServer::address() const { return impl_->address; }

TeacherInfo TeacherServer::info() const { return impl_->info(); }

const std::string& TeacherServer::checkpoint() const { return impl_->model->path(); }

void TeacherServer::wait() {
  std::unique_lock lk(impl_->done_mu);
  impl_->done_cv.wait(lk, [&] { return impl_->done; });
}

void TeacherServer::shutdown() {
  auto& s = *impl_;
  std::call_once(s.shutdown_once, [&s] {
    {
      const std::lock_guard lk(s.mu);
      s.stopping = true;
    }
    // gRPC waits for the calls in flight, which the inference thread goes on answering; past the grace it
    // cancels them, and the inference thread then drops them without computing.
    s.server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    s.stop_worker();
    s.server.reset();
    {
      const std::lock_guard lk(s.done_mu);
      s.done = true;
    }
    s.done_cv.notify_all();
  });
}

}  // namespace sinew::serve
