// A PyTorch model on the device path without a GPU: TorchWorkload on_device() over 2-3 MPI ranks with the
// fake NCCL (tests/mpi/nccl_fake.hpp), whose "device memory" is host memory and whose streams and events are
// its own handles. The session reduces the model's gradients through the fabric's DeviceBucketer and the
// NCCL backend, each bucket after the events the hooks recorded, in the flat gradient buffer autograd wrote
// (no copy), and the fused optimiser runs as torch operations (TensorOptimizer); BatchNorm's statistics go
// device -> host -> broadcast -> device after every step. The result must be the host path's (MPI, the
// Eigen optimiser) from the same start. On a real GPU the same code records CUDA events on torch's stream
// (torch/cuda/ready_events.cpp), which only a machine with GPUs can run (docs/gpu.md).
#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "nccl_fake.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/torch/workload.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/session.hpp"

using namespace sinew;
using comm::nccl::FakeApi;
using pytorch::TorchWorkload;

namespace {

constexpr std::int64_t kTrain = 192;

/// The fake NCCL's events on a compute stream of its own, one per parameter; counts the records.
class FakeEvents final : public pytorch::ReadyEvents {
 public:
  FakeEvents(FakeApi& api, std::size_t n, std::vector<cudaEvent_t>& made, std::size_t& recorded)
      : api_(api), events_(n), recorded_(recorded) {
    EXPECT_EQ(api.stream_create(&stream_), cudaSuccess);
    for (cudaEvent_t& e : events_) EXPECT_EQ(api.event_create(&e), cudaSuccess);
    made = events_;
  }
  FakeEvents(const FakeEvents&) = delete;
  FakeEvents& operator=(const FakeEvents&) = delete;
  FakeEvents(FakeEvents&&) = delete;
  FakeEvents& operator=(FakeEvents&&) = delete;
  ~FakeEvents() override {
    for (cudaEvent_t e : events_) (void)api_.event_destroy(e);
    (void)api_.stream_destroy(stream_);
  }
  CUevent_st* record(std::size_t i) override {
    EXPECT_EQ(api_.event_record(events_.at(i), stream_), cudaSuccess);
    ++recorded_;
    return events_[i];
  }

 private:
  FakeApi& api_;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::size_t& recorded_;
};

train::Config config() {
  train::Config c;
  c.epochs = 2;
  c.batch_size = 8;
  c.lr = 0.05f;
  c.lr_schedule = "constant";
  c.warmup_steps = 0;
  c.progress = false;
  c.resume = "never";
  c.timeout_ms = 30000;  // a hang fails long before ctest's deadline
  return c;
}

struct Outcome {
  std::vector<float> params;
  std::vector<float> running_mean;
  std::int64_t steps = 0;
  std::size_t recorded = 0;                 // events recorded by the hooks
  std::vector<cudaEvent_t> events;          // the events made (device path)
  std::uintptr_t grads = 0, grads_end = 0;  // the flat gradient buffer autograd wrote
};

/// Trains a small model with BatchNorm over every rank, on the device path with `api` (else the host path).
Outcome train_over(FakeApi* api) {
  torch::manual_seed(11);
  const auto x = torch::randn({kTrain, 6});
  const auto y = torch::randint(0, 3, {kTrain});
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::BatchNorm1d(16),
                            torch::nn::Functional(torch::relu), torch::nn::Linear(16, 3));
  net->train();
  const train::Config cfg = config();
  Outcome run;
  std::unique_ptr<TorchWorkload> work;
  if (api != nullptr) {
    std::vector<pytorch::NamedTensor> params, buffers;
    for (const auto& p : net->named_parameters()) params.push_back({p.key(), p.value()});
    for (const auto& b : net->named_buffers())
      if (b.value().scalar_type() == torch::kFloat) buffers.push_back({b.key(), b.value()});
    pytorch::Device device{0, 1, std::make_unique<FakeEvents>(*api, params.size(), run.events, run.recorded)};
    work = std::make_unique<TorchWorkload>(std::move(params), std::move(buffers),
                                           train::optimizer_options(cfg), "net", std::move(device));
    EXPECT_TRUE(work->on_device());
    EXPECT_NE(work->params().data(), work->flat_params().data_ptr<float>()) << "a host record of its own";
  } else {
    work = TorchWorkload::of(*net, train::optimizer_options(cfg), "net");
  }
  run.grads = reinterpret_cast<std::uintptr_t>(work->flat_grads().data_ptr<float>());
  run.grads_end = run.grads + static_cast<std::uintptr_t>(work->flat_grads().numel()) * sizeof(float);
  train::SessionParts parts;
  parts.train_size = kTrain;
  parts.nccl_api = api;
  train::Session s(cfg, membership::Group::over(mpi::Communicator::borrow(MPI_COMM_WORLD)), *work,
                   std::move(parts));
  if (api != nullptr) {
    work->set_device_ready([&s](Slice r, CUevent_st* e) { s.grad_ready(r, e); });
  } else {
    work->set_ready([&s](Slice r) { s.grad_ready(r); });
  }
  EXPECT_TRUE(s.start());
  for (;;) {
    const train::Next n = s.next();
    if (n == train::Next::kDone) break;
    if (n == train::Next::kEvaluate) {
      (void)s.begin_evaluation(0);
      s.end_evaluation({}, 0);
      continue;
    }
    const train::StepPlan& plan = s.begin_step();
    double loss = 0;
    for (std::size_t j = 0; j < plan.micro_batches; ++j) {
      const auto idx = s.micro_batch(j);
      work->begin_micro_batch(j, plan.micro_batches, idx.size(), plan.total);
      if (idx.empty()) {
        work->skip_micro_batch();
        continue;
      }
      std::vector<std::int64_t> rows(idx.begin(), idx.end());
      const auto t = torch::tensor(rows);
      const auto l =
          torch::nn::functional::cross_entropy(net->forward(x.index_select(0, t)), y.index_select(0, t));
      l.backward();
      loss += l.item<double>() * static_cast<double>(idx.size()) / static_cast<double>(plan.total);
    }
    work->disarm();
    s.end_step(loss);
    if (s.boundary() != train::After::kContinue) break;
  }
  const train::Summary sum = s.finish();
  EXPECT_EQ(sum.exit_code(), 0);
  run.steps = sum.steps;
  work->to_host();
  run.params.assign(work->params().begin(), work->params().end());
  const auto rm = net->named_buffers()["1.running_mean"].to(torch::kCPU);
  run.running_mean.assign(rm.data_ptr<float>(), rm.data_ptr<float>() + rm.numel());
  return run;
}

double worst(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::abs(static_cast<double>(a[i]) - b[i]) / (1 + std::abs(static_cast<double>(a[i]))));
  return w;
}

}  // namespace

TEST(TorchDevice, DevicePathOverTheFakeNcclTrainsAsTheHostPath) {
  const Outcome host = train_over(nullptr);
  FakeApi api;
  const Outcome dev = train_over(&api);
  ASSERT_EQ(dev.params.size(), host.params.size());
  EXPECT_EQ(dev.steps, host.steps);
  EXPECT_GT(dev.steps, 10);
  EXPECT_LE(worst(host.params, dev.params), 1e-5)
      << "the device path's parameters differ from the host path's";
  EXPECT_LE(worst(host.running_mean, dev.running_mean), 1e-6) << "BatchNorm's statistics differ";
  // Every range of every step was reported with an event, and the NCCL stream waited for those events
  // before reducing buckets that lie in the flat gradient buffer autograd wrote.
  EXPECT_EQ(dev.recorded, static_cast<std::size_t>(dev.steps) * 6);
  std::size_t waits = 0, reductions = 0;
  for (const auto& j : api.journal()) {
    if (j.kind == FakeApi::JournalEntry::Kind::kStreamWait &&
        std::find(dev.events.begin(), dev.events.end(), j.event) != dev.events.end())
      ++waits;
    const auto p = reinterpret_cast<std::uintptr_t>(j.data);
    if (j.kind == FakeApi::JournalEntry::Kind::kCollective && j.op == "allreduce" && p >= dev.grads &&
        p + j.count * sizeof(float) <= dev.grads_end)
      ++reductions;
  }
  EXPECT_GE(waits, static_cast<std::size_t>(dev.steps)) << "the reductions did not wait for the ready events";
  EXPECT_GE(reductions, static_cast<std::size_t>(dev.steps)) << "no allreduce in the flat gradient buffer";
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::printf(
        "[device_test] %lld steps; largest relative difference to the host path %.2e; %zu events "
        "recorded, %zu stream waits on them, %zu allreduces in the gradient buffer\n",
        static_cast<long long>(dev.steps), worst(host.params, dev.params), dev.recorded, waits, reductions);
  }
  EXPECT_TRUE(api.misuse().empty());
  EXPECT_EQ(api.live_comms(), 0);
}
