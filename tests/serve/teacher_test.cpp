// The teacher of distillation: its model from a checkpoint (src/sinew/distill/teacher_model.*), and the gRPC
// service over it (src/sinew/serve/teacher_server.*, teacher_client.*), in process, on a free port of
// 127.0.0.1. The checkpoint is a real one, written by checkpoint::Writer (one rank, no MPI) from a model of
// the synthetic data set, with the configuration a training run records.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/writer.hpp"
#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/distill/teacher_model.hpp"
#include "sinew/model/model.hpp"
#include "sinew/serve/teacher_client.hpp"
#include "sinew/serve/teacher_server.hpp"
#include "teacher.grpc.pb.h"

namespace fs = std::filesystem;

namespace sinew::serve {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kToken = "teacher-test-token";
constexpr std::int64_t kStep = 40;
constexpr const char* kSpec = "mlp:32";

/// A backend of one rank, for checkpoint::Writer without MPI: every collective is complete at once.
class SelfBackend final : public comm::Backend {
  class Done final : public comm::Work {
   public:
    bool test() override { return true; }
    void wait(std::chrono::milliseconds /*timeout*/) override {}
    void abort() noexcept override {}
  };
  static std::unique_ptr<comm::Work> done() { return std::make_unique<Done>(); }

 public:
  [[nodiscard]] std::string name() const override { return "self"; }
  [[nodiscard]] int rank() const override { return 0; }
  [[nodiscard]] int size() const override { return 1; }
  std::unique_ptr<comm::Work> allreduce(comm::Buffer /*buf*/, comm::ReduceOp /*op*/,
                                        const comm::Options& /*o*/) override {
    return done();
  }
  std::unique_ptr<comm::Work> broadcast(comm::Buffer /*buf*/, int /*root*/,
                                        const comm::Options& /*o*/) override {
    return done();
  }
  std::unique_ptr<comm::Work> allgather(comm::Buffer in, comm::Buffer out,
                                        const comm::Options& /*o*/) override {
    if (in.bytes() > 0) std::memcpy(out.data, in.data, in.bytes());
    return done();
  }
  std::unique_ptr<comm::Work> send(comm::Buffer /*buf*/, int peer, const comm::Options& /*o*/) override {
    SINEW_THROW(InternalError, "SelfBackend: no peer {} to send to", peer);
  }
  std::unique_ptr<comm::Work> recv(comm::Buffer /*buf*/, int peer, const comm::Options& /*o*/) override {
    SINEW_THROW(InternalError, "SelfBackend: no peer {} to receive from", peer);
  }
  std::unique_ptr<comm::Work> barrier(const comm::Options& /*o*/) override { return done(); }
  void allreduce_blocking(comm::Buffer /*buf*/, comm::ReduceOp /*op*/) override {}
  void abort() noexcept override {}
};

/// What every test shares: a checkpoint root with one committed checkpoint, its data and its parameters.
struct World {
  fs::path dir;   // removed at exit
  fs::path root;  // the checkpoint root (a run's --checkpoint-dir)
  data::Dataset train;
  std::string fingerprint;
  std::vector<float> params;
};

data::DatasetOptions data_options() {
  data::DatasetOptions o;
  o.name = "synthetic";
  o.seed = 3;
  o.limit_train = 3000;
  o.limit_test = 500;
  return o;
}

World make_world() {
  World w;
  std::string tmpl = (fs::temp_directory_path() / "sinew-teacher-test-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  w.dir = tmpl;
  w.root = w.dir / "run";
  w.train = data::load_dataset(data_options()).train;
  w.fingerprint = data::fingerprint(w.train);
  // Parameters other than a fresh model's (the teacher must load them, not rebuild them from the seed).
  auto net =
      model::Model::build(kSpec, {w.train.channels, w.train.height, w.train.width}, w.train.num_classes, 11);
  auto p = net.params();
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = p[i] * 1.5f + 0.001f * static_cast<float>(i % 7);
  w.params.assign(p.begin(), p.end());

  checkpoint::TrainingState st;
  st.tensors["params"] = w.params;
  st.tensors["optim/momentum"] = std::vector<float>(w.params.size(), 0.5f);
  st.step = kStep;
  st.dataset_size = w.train.size();
  st.seed = 3;
  st.world_size = 1;
  const auto o = data_options();
  st.config_json = nlohmann::json{
      {"model", kSpec},
      {"dataset", o.name},
      {"data_dir", ""},
      {"limit_train", o.limit_train},
      {"limit_test", o.limit_test},
      {"seed", 3}}.dump();
  SelfBackend backend;
  checkpoint::Writer writer(w.root.string(), backend);
  writer.save(st);
  return w;
}

World& world() {
  static World w = make_world();
  // Registered after `w` is complete, so it runs before `w` is destroyed.
  static const bool cleanup = [] {
    return std::atexit([] {
             std::error_code ec;
             fs::remove_all(world().dir, ec);
           }) == 0;
  }();
  (void)cleanup;
  return w;
}

std::string checkpoint_dir() { return checkpoint::checkpoint_path(world().root.string(), kStep); }

/// The logits the teacher must give: its model, computed directly in one forward pass.
std::vector<float> direct_logits(const std::vector<std::size_t>& indices) {
  auto m = distill::TeacherModel::load(world().root.string(), world().train);
  std::vector<float> out;
  m.logits(world().train, indices, out);
  return out;
}

ServeOptions serve_options() {
  ServeOptions o;
  o.checkpoint = world().root.string();
  o.token = kToken;
  return o;
}

Clock::time_point in(milliseconds ms) { return Clock::now() + ms; }

std::vector<std::size_t> some_indices(std::size_t n, std::size_t seed) {
  std::vector<std::size_t> v(n);
  data::Rng rng(seed);
  for (auto& i : v) i = rng.uniform_below(world().train.size());
  return v;
}

/// Runs `call`, expects a TeacherError of `code`; returns its message.
template <class F>
std::string expect_rpc_error(F&& call, RpcCode code) {
  try {
    call();
  } catch (const TeacherError& e) {
    EXPECT_EQ(rpc_code_name(e.code()), rpc_code_name(code)) << e.message();
    EXPECT_EQ(e.exit_code(), ExitCode::kService);
    EXPECT_NE(e.message().find(rpc_code_name(code)), std::string::npos) << e.message();
    return e.message();
  }
  ADD_FAILURE() << "no TeacherError (" << rpc_code_name(code) << ")";
  return {};
}

std::shared_ptr<grpc::Channel> channel_to(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

// ---------------------------------------------------------------------------------------------------- model

TEST(TeacherModel, LoadsACheckpointOrItsRoot) {
  const auto& w = world();
  auto from_root = distill::TeacherModel::load(w.root.string(), w.train);
  auto from_dir = distill::TeacherModel::load(checkpoint_dir() + "/", w.train);
  EXPECT_EQ(from_root.path(), checkpoint_dir());
  EXPECT_EQ(from_dir.path(), checkpoint_dir());
  EXPECT_EQ(from_root.step(), kStep);
  EXPECT_EQ(from_root.spec(), kSpec);
  EXPECT_EQ(from_root.classes(), w.train.num_classes);

  // Its logits are those of the checkpoint's parameters (not of a model rebuilt from the seed).
  auto net =
      model::Model::build(kSpec, {w.train.channels, w.train.height, w.train.width}, w.train.num_classes, 0);
  std::copy(w.params.begin(), w.params.end(), net.params().begin());
  const auto idx = some_indices(300, 1);
  std::vector<float> x(static_cast<std::size_t>(w.train.dim()) * idx.size());
  w.train.gather(idx, x.data(), nullptr);
  const auto& y = net.forward(
      Eigen::Map<const model::Matrix>(x.data(), w.train.dim(), static_cast<Eigen::Index>(idx.size())));
  std::vector<float> out;
  from_dir.logits(w.train, idx, out);
  ASSERT_EQ(out.size(), static_cast<std::size_t>(y.size()));
  EXPECT_EQ(std::memcmp(out.data(), y.data(), out.size() * sizeof(float)), 0);

  // More samples than one chunk: each column as computed alone within its chunk.
  const auto many = some_indices(2 * distill::TeacherModel::kChunk + 5, 2);
  from_dir.logits(w.train, many, out);
  ASSERT_EQ(out.size(), many.size() * static_cast<std::size_t>(from_dir.classes()));
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }));
  std::vector<float> tail;
  from_dir.logits(w.train, std::span(many).subspan(2 * distill::TeacherModel::kChunk), tail);
  EXPECT_EQ(std::memcmp(tail.data(), out.data() + 2 * distill::TeacherModel::kChunk * 10,
                        tail.size() * sizeof(float)),
            0);
}

TEST(TeacherModel, DatasetOptionsAreTheRunsOwn) {
  const auto o = distill::TeacherModel::dataset_options(world().root.string());
  EXPECT_EQ(o.name, "synthetic");
  EXPECT_EQ(o.seed, 3u);
  EXPECT_EQ(o.limit_train, 3000u);
  EXPECT_EQ(o.limit_test, 500u);
}

TEST(TeacherModel, RefusesUnusableCheckpointsAndData) {
  const auto& w = world();
  EXPECT_THROW(distill::TeacherModel::load((w.dir / "nonexistent").string(), w.train), CheckpointError);
  const auto empty = w.dir / "empty-root";
  fs::create_directories(empty);
  EXPECT_THROW(distill::TeacherModel::load(empty.string(), w.train), CheckpointError);
  // A checkpoint directory without its commit record: being written, or abandoned.
  const auto partial = w.dir / "partial" / checkpoint::checkpoint_name(7);
  fs::create_directories(partial);
  try {
    (void)distill::TeacherModel::load(partial.string(), w.train);
    ADD_FAILURE() << "an uncommitted checkpoint was loaded";
  } catch (const CheckpointError& e) {
    EXPECT_NE(e.message().find("not committed"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(partial.string()), std::string::npos) << e.message();
  }
  // Other data: another sample shape, or another class count.
  const auto other = data::make_synthetic(100, 1, 4, 4, 10, 1);
  EXPECT_THROW(distill::TeacherModel::load(w.root.string(), other), InvalidArgument);
  const auto classes = data::make_synthetic(100, 1, 8, 8, 5, 1);
  EXPECT_THROW(distill::TeacherModel::load(w.root.string(), classes), InvalidArgument);
}

// ------------------------------------------------------------------------------------------------- service

TEST(TeacherService, RoundTripIsBitForBit) {
  TeacherServer server(serve_options());
  EXPECT_TRUE(server.address().starts_with("127.0.0.1:")) << server.address();
  EXPECT_EQ(server.checkpoint(), checkpoint_dir());
  TeacherClient client(server.address(), kToken);
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{300}, std::size_t{4096}}) {
    const auto idx = some_indices(n, n);
    std::vector<float> got;
    int classes = 0;
    client.infer(idx, world().fingerprint, in(seconds(20)), got, classes);
    EXPECT_EQ(classes, world().train.num_classes);
    // Alone on the server, a request is one forward pass of the same samples (chunks of 1024 alike).
    const auto want = direct_logits(idx);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << n << " samples";
  }
}

TEST(TeacherService, InfoDescribesTheTeacher) {
  auto o = serve_options();
  o.max_request_samples = 512;
  TeacherServer server(o);
  TeacherClient client(server.address(), kToken);
  auto i = client.info(in(seconds(10)));
  EXPECT_EQ(i.address, server.address());
  EXPECT_EQ(i.model, kSpec);
  EXPECT_EQ(i.classes, world().train.num_classes);
  EXPECT_EQ(i.dataset, world().fingerprint);
  EXPECT_EQ(i.train_size, world().train.size());
  EXPECT_EQ(i.max_request_samples, 512u);
  EXPECT_EQ(i.checkpoint_step, kStep);
  EXPECT_EQ(i.samples_per_s, 0.0);  // nothing computed yet
  EXPECT_EQ(i.requests, 0u);
  const auto port = server.address().substr(server.address().rfind(':') + 1);
  EXPECT_TRUE(i.id.ends_with(":" + std::to_string(::getpid()) + ":" + port)) << i.id;
  EXPECT_EQ(i.id, server.info().id);

  std::vector<float> out;
  int classes = 0;
  client.infer(some_indices(100, 5), world().fingerprint, in(seconds(10)), out, classes);
  i = client.info(in(seconds(10)));
  EXPECT_GT(i.samples_per_s, 0.0);
  EXPECT_EQ(i.requests, 1u);
  EXPECT_EQ(i.forward_passes, 1u);
}

TEST(TeacherService, ConcurrentClientsAreMergedAndCorrect) {
  auto o = serve_options();
  o.max_batch = 1024;
  TeacherServer server(o);
  TeacherClient shared(server.address(), kToken);  // one channel for all threads: the client is thread-safe
  constexpr int kThreads = 8, kRequests = 25;
  std::atomic<int> wrong{0}, failed{0}, inexact{0};
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Half the threads share one client, the others have their own channel.
      std::optional<TeacherClient> own;
      if (t % 2 == 1) own.emplace(server.address(), kToken);
      TeacherClient& c = own ? *own : shared;
      for (int r = 0; r < kRequests; ++r) {
        const auto idx = some_indices(64 + 16 * t, static_cast<std::size_t>(1000 * t + r));
        std::vector<float> got;
        int classes = 0;
        try {
          c.infer(idx, world().fingerprint, in(seconds(30)), got, classes);
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          ++failed;
          continue;
        }
        // Merged with other requests, a sample's logits come from a forward pass of another batch width,
        // where Eigen may round differently in the last bits: equal within float rounding.
        const auto want = direct_logits(idx);
        if (got.size() != want.size()) {
          ++wrong;
          continue;
        }
        if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) ++inexact;
        for (std::size_t k = 0; k < got.size(); ++k) {
          if (std::abs(got[k] - want[k]) > 1e-5f * (1.f + std::abs(want[k]))) {
            ++wrong;
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  const auto i = server.info();
  EXPECT_EQ(i.requests, static_cast<std::uint64_t>(kThreads * kRequests));
  // Requests that arrived while a forward pass ran share the next one.
  EXPECT_LT(i.forward_passes, i.requests);
  std::printf(
      "%llu requests in %llu forward passes, %.0f samples/s; %d not bit-equal to a pass of their own\n",
      static_cast<unsigned long long>(i.requests), static_cast<unsigned long long>(i.forward_passes),
      i.samples_per_s, inexact.load());
}

TEST(TeacherService, RefusesWrongOrMissingToken) {
  TeacherServer server(serve_options());
  TeacherClient wrong(server.address(), "not-the-token");
  std::vector<float> out;
  int classes = 0;
  const auto msg = expect_rpc_error(
      [&] { wrong.infer(some_indices(4, 1), world().fingerprint, in(seconds(10)), out, classes); },
      RpcCode::kUnauthenticated);
  EXPECT_NE(msg.find(server.address()), std::string::npos) << msg;
  expect_rpc_error([&] { wrong.info(in(seconds(10))); }, RpcCode::kUnauthenticated);
  // A prefix of the token is no token.
  TeacherClient prefix(server.address(), std::string(kToken).substr(0, 5));
  expect_rpc_error([&] { prefix.info(in(seconds(10))); }, RpcCode::kUnauthenticated);

  // No metadata at all: the generated stub, without the client's token.
  auto stub = rpc::Teacher::NewStub(channel_to(server.address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  rpc::InferRequest req;
  req.set_dataset(world().fingerprint);
  req.add_indices(0);
  rpc::InferReply reply;
  EXPECT_EQ(stub->Infer(&ctx, req, &reply).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TeacherService, RefusesBadRequests) {
  auto o = serve_options();
  o.max_request_samples = 64;
  TeacherServer server(o);
  TeacherClient client(server.address(), kToken);
  std::vector<float> out;
  int classes = 0;
  const auto& fp = world().fingerprint;
  auto msg = expect_rpc_error([&] { client.infer(some_indices(65, 1), fp, in(seconds(10)), out, classes); },
                              RpcCode::kInvalidArgument);
  EXPECT_NE(msg.find("at most 64"), std::string::npos) << msg;
  client.infer(some_indices(64, 1), fp, in(seconds(10)), out, classes);  // the limit itself is fine

  const std::vector<std::size_t> beyond{0, world().train.size()};
  msg = expect_rpc_error([&] { client.infer(beyond, fp, in(seconds(10)), out, classes); },
                         RpcCode::kInvalidArgument);
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  const std::vector<std::size_t> huge{~std::size_t{0}};
  expect_rpc_error([&] { client.infer(huge, fp, in(seconds(10)), out, classes); }, RpcCode::kInvalidArgument);
  expect_rpc_error([&] { client.infer({}, fp, in(seconds(10)), out, classes); }, RpcCode::kInvalidArgument);

  msg = expect_rpc_error(
      [&] { client.infer(some_indices(4, 1), "3000x64:10:deadbeef", in(seconds(10)), out, classes); },
      RpcCode::kFailedPrecondition);
  EXPECT_NE(msg.find("3000x64:10:deadbeef"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fp), std::string::npos) << msg;
}

TEST(TeacherService, SurvivesMalformedRequests) {
  auto o = serve_options();
  o.max_request_samples = 64;
  TeacherServer server(o);
  const auto channel = channel_to(server.address());

  // Bytes that are no InferRequest, sent as one: refused by gRPC's parsing, never seen by the service.
  grpc::GenericStub generic(channel);
  for (const std::string& garbage : {std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                                     std::string("\x12\x80\x80\x80\x80\x10", 6), std::string(1000, '\x0a')}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    ctx.AddMetadata("x-sinew-token", kToken);
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/sinew.serve.rpc.Teacher/Infer", grpc::StubOptions(), &request, &response,
                      [&](grpc::Status s) { done.set_value(std::move(s)); });
    const auto status = done.get_future().get();
    EXPECT_FALSE(status.ok());
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  }

  // A message beyond the receive limit (far more indices than max_request_samples).
  auto stub = rpc::Teacher::NewStub(channel);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    ctx.AddMetadata("x-sinew-token", kToken);
    rpc::InferRequest req;
    req.set_dataset(world().fingerprint);
    for (int i = 0; i < 100000; ++i) req.add_indices(static_cast<std::uint64_t>(i % 3000));
    rpc::InferReply reply;
    EXPECT_EQ(stub->Infer(&ctx, req, &reply).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }

  // The server still answers.
  TeacherClient client(server.address(), kToken);
  std::vector<float> out;
  int classes = 0;
  client.infer(some_indices(8, 3), world().fingerprint, in(seconds(10)), out, classes);
  EXPECT_EQ(out.size(), 8u * static_cast<std::size_t>(classes));
}

TEST(TeacherService, DeadlinePassedFailsAtOnce) {
  TeacherServer server(serve_options());
  TeacherClient client(server.address(), kToken);
  std::vector<float> out;
  int classes = 0;
  const auto t0 = Clock::now();
  expect_rpc_error(
      [&] {
        client.infer(some_indices(8, 1), world().fingerprint, Clock::now() - milliseconds(1), out, classes);
      },
      RpcCode::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - t0, seconds(1));
}

TEST(TeacherService, ShutDownTeacherIsUnavailable) {
  std::string address;
  {
    TeacherServer server(serve_options());
    address = server.address();
    TeacherClient client(address, kToken);
    std::vector<float> out;
    int classes = 0;
    client.infer(some_indices(8, 1), world().fingerprint, in(seconds(10)), out, classes);  // connected
    std::thread stopper([&] { server.shutdown(); });
    server.wait();  // returns once shutdown() is done
    stopper.join();
    server.shutdown();  // idempotent

    const auto t0 = Clock::now();
    expect_rpc_error(
        [&] { client.infer(some_indices(8, 1), world().fingerprint, in(seconds(5)), out, classes); },
        RpcCode::kUnavailable);
    EXPECT_LT(Clock::now() - t0, seconds(5));
  }
  // Gone altogether: a fresh client, refused connection.
  TeacherClient late(address, kToken);
  std::vector<float> out;
  int classes = 0;
  const auto t0 = Clock::now();
  expect_rpc_error([&] { late.infer(some_indices(8, 1), world().fingerprint, in(seconds(5)), out, classes); },
                   RpcCode::kUnavailable);
  EXPECT_LT(Clock::now() - t0, seconds(5));
}

TEST(TeacherService, RefusesBadOptions) {
  auto o = serve_options();
  o.token.clear();
  EXPECT_THROW(TeacherServer{o}, InvalidArgument);
  o = serve_options();
  o.listen = "127.0.0.1";
  EXPECT_THROW(TeacherServer{o}, InvalidArgument);
  o.listen = "127.0.0.1:http";
  EXPECT_THROW(TeacherServer{o}, InvalidArgument);
  o = serve_options();
  o.max_request_samples = 0;
  EXPECT_THROW(TeacherServer{o}, InvalidArgument);
  o = serve_options();
  o.checkpoint = (world().dir / "nonexistent").string();
  EXPECT_THROW(TeacherServer{o}, CheckpointError);

  // A port that another teacher holds.
  TeacherServer first(serve_options());
  o = serve_options();
  o.listen = first.address();
  EXPECT_THROW(TeacherServer{o}, ServiceError);
}

}  // namespace
}  // namespace sinew::serve
