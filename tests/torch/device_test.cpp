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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "nccl_fake.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/torch/workload.hpp"
#include "sinew/train/driver.hpp"
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

train::Config config(train::ShardStage shard = train::ShardStage::kNone, int replicas = 2) {
  train::Config c;
  c.shard = shard;
  c.shard_replicas = replicas;
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
  std::size_t recorded = 0;                                 // events recorded by the hooks
  std::vector<cudaEvent_t> events;                          // the events made (device path)
  std::uintptr_t grads = 0, grads_end = 0;                  // the flat gradient buffer autograd wrote
  std::uintptr_t device_params = 0, device_params_end = 0;  // the flat parameter buffer ("device")
  std::vector<float> last_grads;                            // the flat gradients after the last step
  std::vector<Slice> held;      // --shard gradients: the ranges of them this member holds
  int failures = 0, world = 0;  // recoveries lived through; the group's size at the end
};

/// A script's optimiser per shard, as the Python package makes a torch.optim one (sinew/optim.py): momentum
/// SGD in torch operations over views of the range of work.host_params()/host_grads(), with its momentum as
/// its state. The runtime steps it where it steps its own shards; on a device that is the host record.
pytorch::ShardFactory script_optimizer(TorchWorkload& work) {
  return [&work](Slice r, const optim::StatePlacement&) {  // (its state initialised always)
    const auto range = [r](const at::Tensor& t) {
      return t.narrow(0, static_cast<std::int64_t>(r.offset), static_cast<std::int64_t>(r.count));
    };
    at::Tensor params = range(work.host_params()), grads = range(work.host_grads());
    at::Tensor momentum = at::zeros({static_cast<std::int64_t>(r.count)});
    auto steps = std::make_shared<std::int64_t>(0);
    pytorch::ExternalOptimizer o;
    o.state = {{"momentum_buffer", momentum}};
    o.step = [params, grads, momentum, steps](float lr) mutable {
      at::NoGradGuard no_grad;
      momentum.mul_(0.5).add_(grads);  // (not Sinew's own 0.9: its run must differ)
      params.sub_(momentum, lr);
      ++*steps;
    };
    o.steps = [steps] { return *steps; };
    o.set_steps = [steps](std::int64_t n) { *steps = n; };
    return o;
  };
}

/// Trains a small model with BatchNorm over every rank, on the device path with `api` (else the host path),
/// with the optimiser state sharded as `shard` says (by script_optimizer()'s shards where `script`).
Outcome train_over(FakeApi* api, train::ShardStage shard = train::ShardStage::kNone, int replicas = 2,
                   const char* fault = nullptr, bool script = false) {
  torch::manual_seed(11);
  const auto x = torch::randn({kTrain, 6});
  const auto y = torch::randint(0, 3, {kTrain});
  torch::manual_seed(5);
  torch::nn::Sequential net(torch::nn::Linear(6, 16), torch::nn::BatchNorm1d(16),
                            torch::nn::Functional(torch::relu), torch::nn::Linear(16, 3));
  net->train();
  train::Config cfg = config(shard, replicas);
  if (fault != nullptr) {  // a member killed: the survivors go on without a replacement
    cfg.inject_fault.push_back(fault::parse_fault(fault));
    cfg.grow = false;
  }
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
  if (shard != train::ShardStage::kNone) work->shard_state();  // as Job::start does for a C++ caller
  if (script) work->use_sharded_optimizer("script-sgd", script_optimizer(*work));
  run.grads = reinterpret_cast<std::uintptr_t>(work->flat_grads().data_ptr<float>());
  run.grads_end = run.grads + static_cast<std::uintptr_t>(work->flat_grads().numel()) * sizeof(float);
  run.device_params = reinterpret_cast<std::uintptr_t>(work->flat_params().data_ptr<float>());
  run.device_params_end =
      run.device_params + static_cast<std::uintptr_t>(work->flat_params().numel()) * sizeof(float);
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
  work->set_first_ready([&s] { s.fault(fault::Point::kBackward); });
  // The loop of a C++ job (torch/job.cpp): the driver recovers a failure in place and plans the lost step
  // again; the hooks roll BatchNorm's statistics back to the last completed step's.
  train::DriverHooks hooks;
  hooks.step_ends = [&work] { work->disarm(); };
  hooks.step_ended = [&work, &run] {
    work->keep_buffers();
    const auto g = work->flat_grads().to(torch::kCPU);  // the reduced gradients the update read
    run.last_grads.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  };
  hooks.recovering = [&work] {
    work->disarm();
    work->restore_buffers();
  };
  train::Driver driver(s, 0, std::move(hooks));
  const train::Summary sum = driver.run(
      [&](const train::Task& t) {
        work->begin_micro_batch(t.micro_batch, t.micro_batches, t.indices.size(), t.total);
        if (t.indices.empty()) {
          work->skip_micro_batch();
          return 0.0;
        }
        std::vector<std::int64_t> rows(t.indices.begin(), t.indices.end());
        const auto idx = torch::tensor(rows);
        const auto l = torch::nn::functional::cross_entropy(net->forward(x.index_select(0, idx)),
                                                            y.index_select(0, idx));
        l.backward();
        return l.item<double>() * static_cast<double>(t.indices.size()) / static_cast<double>(t.total);
      },
      [](std::size_t, std::size_t) { return workload::EvalSums{}; });
  run.held = s.sharded_gradients();
  EXPECT_EQ(sum.exit_code(), 0);
  run.steps = sum.steps;
  run.failures = sum.failures;
  run.world = sum.world_size;
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

/// The device path's run trained as the host path's: the same steps, parameters and BatchNorm statistics.
void expect_trained_alike(const Outcome& host, const Outcome& dev) {
  ASSERT_EQ(dev.params.size(), host.params.size());
  EXPECT_EQ(dev.steps, host.steps);
  EXPECT_GT(dev.steps, 10);
  EXPECT_LE(worst(host.params, dev.params), 1e-5)
      << "the device path's parameters differ from the host path's";
  EXPECT_LE(worst(host.running_mean, dev.running_mean), 1e-6) << "BatchNorm's statistics differ";
}

}  // namespace

TEST(TorchDevice, DevicePathOverTheFakeNcclTrainsAsTheHostPath) {
  const Outcome host = train_over(nullptr);
  FakeApi api;
  const Outcome dev = train_over(&api);
  ASSERT_NO_FATAL_FAILURE(expect_trained_alike(host, dev));
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

// --shard optimizer and gradients on the device path: the reduced gradients of the held shards come to the
// host, the shards' update runs there (the state is there), the updated ranges go back and are all-gathered
// in "device" memory over NCCL; with sharded gradients each bucket is reduce-scattered in place over NCCL,
// the owners' parts go to the other holders in one NCCL group, and the rest is NaN on the device. The
// result must be the host path's with the same sharding (MPI, the same optimiser on the same shards).
TEST(TorchDevice, ShardedStateOverTheFakeNcclTrainsAsTheHostPath) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  struct Case {
    train::ShardStage shard;
    int replicas;
  };
  for (const Case c : {Case{train::ShardStage::kOptimizer, 2}, Case{train::ShardStage::kGradients, 2},
                       Case{train::ShardStage::kGradients, 1}}) {
    SCOPED_TRACE(
        fmt::format("--shard {} --shard-replicas {}", name_of(train::kShardNames, c.shard), c.replicas));
    const Outcome host = train_over(nullptr, c.shard, c.replicas);
    FakeApi api;
    const Outcome dev = train_over(&api, c.shard, c.replicas);
    ASSERT_NO_FATAL_FAILURE(expect_trained_alike(host, dev));
    // The gather after every update ran in the device parameters, over NCCL (an all-gather, or a broadcast
    // per shard where the shards are uneven); the sharded gradients' reduce-scatter in the device gradients.
    std::size_t gathers = 0, scatters = 0, p2p = 0, ungrouped = 0;
    // (Where it writes: an in-place reduce-scatter's journal entry is its output, this rank's block, with the
    // count of the whole input.)
    const auto in = [](const FakeApi::JournalEntry& j, std::uintptr_t lo, std::uintptr_t hi) {
      const auto p = reinterpret_cast<std::uintptr_t>(j.data);
      return p >= lo && p < hi;
    };
    for (const auto& j : api.journal()) {
      if (j.kind == FakeApi::JournalEntry::Kind::kCollective &&
          (j.op == "allgather" || j.op == "broadcast") && in(j, dev.device_params, dev.device_params_end))
        ++gathers;
      if (j.kind == FakeApi::JournalEntry::Kind::kCollective &&
          (j.op == "reduce_scatter" || j.op == "reduce") && in(j, dev.grads, dev.grads_end))
        ++scatters;
      if (j.kind == FakeApi::JournalEntry::Kind::kSend || j.kind == FakeApi::JournalEntry::Kind::kRecv) {
        ++p2p;
        if (j.group == 0) ++ungrouped;
      }
    }
    EXPECT_GE(gathers, static_cast<std::size_t>(dev.steps)) << "no all-gather of the device parameters";
    if (c.shard == train::ShardStage::kGradients) {
      EXPECT_GE(scatters, static_cast<std::size_t>(dev.steps)) << "no reduce-scatter of the device gradients";
      if (c.replicas > 1) {
        EXPECT_GE(p2p, static_cast<std::size_t>(dev.steps)) << "no replica received its shard's gradients";
      }
      EXPECT_EQ(ungrouped, 0U) << "a replica's send or receive outside an NCCL group could deadlock";
      // Held: the reduced gradients (equal to the host path's); not held: NaN.
      ASSERT_FALSE(dev.held.empty());
      std::vector<bool> held(dev.last_grads.size(), false);
      for (const Slice r : dev.held)
        for (std::size_t e = r.offset; e < r.end(); ++e) held[e] = true;
      std::size_t nan_held = 0, not_nan_unheld = 0, unheld = 0;
      for (std::size_t e = 0; e < held.size(); ++e) {
        if (held[e]) {
          nan_held += std::isnan(dev.last_grads[e]) ? 1 : 0;
          EXPECT_NEAR(dev.last_grads[e], host.last_grads[e], 1e-5 * (1 + std::abs(host.last_grads[e]))) << e;
        } else {
          ++unheld;
          not_nan_unheld += std::isnan(dev.last_grads[e]) ? 0 : 1;
        }
      }
      EXPECT_EQ(nan_held, 0U);
      EXPECT_EQ(not_nan_unheld, 0U) << "a gradient this member does not hold reads as a number";
      if (world > c.replicas) {
        EXPECT_GT(unheld, 0U);
      }
    } else {
      EXPECT_EQ(scatters, 0U);
    }
    if (rank == 0) {
      std::printf(
          "[device_test] --shard %s R=%d: %lld steps, largest difference to the host path %.2e, %zu "
          "gathers of device parameters, %zu reduce-scatters, %zu grouped sends/receives\n",
          std::string(name_of(train::kShardNames, c.shard)).c_str(), c.replicas,
          static_cast<long long>(dev.steps), worst(host.params, dev.params), gathers, scatters, p2p);
    }
    EXPECT_TRUE(api.misuse().empty());
    EXPECT_EQ(api.live_comms(), 0);
  }
}

// A script's optimiser per shard on the device path (a torch.optim one from Python: sinew/optim.py makes it
// over work.host_params and host_grads): its shards step the host record the session brought the held
// ranges' reduced gradients to, and the session copies what they wrote to the device. As the host path with
// the same optimiser; a shard over the device buffers instead would have its update overwritten by the
// copy (tested: the run then differs from the host path's by far more than the tolerance).
TEST(TorchDevice, ScriptOptimizerShardsStepTheHostRecord) {
  for (const train::ShardStage shard : {train::ShardStage::kOptimizer, train::ShardStage::kGradients}) {
    SCOPED_TRACE(fmt::format("--shard {}", name_of(train::kShardNames, shard)));
    const Outcome host = train_over(nullptr, shard, 2, nullptr, /*script=*/true);
    FakeApi api;
    const Outcome dev = train_over(&api, shard, 2, nullptr, /*script=*/true);
    ASSERT_NO_FATAL_FAILURE(expect_trained_alike(host, dev));
    const Outcome own = train_over(nullptr, shard, 2);  // Sinew's own optimiser: the script's moved the model
    EXPECT_GT(worst(own.params, host.params), 0.0) << "the script's optimiser was not the one stepped";
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      std::printf(
          "[device_test] a script's optimiser, --shard %s R=2: %lld steps, largest difference to the "
          "host path %.2e\n",
          std::string(name_of(train::kShardNames, shard)).c_str(), static_cast<long long>(dev.steps),
          worst(host.params, dev.params));
    }
    EXPECT_TRUE(api.misuse().empty());
  }
}

// A member killed with sharded state on the device path. SINEW_DEVICE_KILL_STAGE=gradients (R = 2): killed
// in backward at step 6, the survivors' NCCL reduce-scatter fails; optimizer (R = 2): killed before its
// update at step 6, the survivors' NCCL all-gather of the updated parameters fails after they completed the
// step. Either way they abort the communicator, shrink, take the dead member's shards from its replicas
// (host record: the device parameters copied down, resharded over MPI, copied up), rebuild NCCL over the
// two of them and go on after the last step they completed, from the same samples. The same run on the
// host path (MPI, same fault) is the reference: ctest's torch.device-kill.np3 (device_kill.sh) runs it
// first with SINEW_DEVICE_KILL=host, which writes rank 0's final parameters to SINEW_DEVICE_KILL_REFERENCE,
// then with =device, which compares with them.
TEST(TorchDeviceFailure, ShardedMemberKilledRecoversInPlace) {
  // (Read before the session starts any thread.)
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe)
    return v != nullptr ? v : "";
  };
  const std::string mode = env("SINEW_DEVICE_KILL"), path = env("SINEW_DEVICE_KILL_REFERENCE");
  if (mode.empty() || path.empty())
    GTEST_SKIP() << "run by ctest's torch.device-kill.np3 (SINEW_DEVICE_KILL, SINEW_DEVICE_KILL_REFERENCE)";
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  ASSERT_EQ(world, 3) << "a test of 3 ranks";
  const bool device = mode == "device";
  const bool zero1 = env("SINEW_DEVICE_KILL_STAGE") == "optimizer";
  std::unique_ptr<FakeApi> api = device ? std::make_unique<FakeApi>() : nullptr;
  const Outcome run = zero1 ? train_over(api.get(), train::ShardStage::kOptimizer, 2, "2:optimizer:6")
                            : train_over(api.get(), train::ShardStage::kGradients, 2, "2:backward:6");
  EXPECT_EQ(run.failures, 1);
  EXPECT_EQ(run.world, 2);
  EXPECT_GT(run.steps, 10);
  if (rank != 0) return;
  if (!device) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(run.params.data()),
              static_cast<std::streamsize>(run.params.size() * sizeof(float)));
    ASSERT_TRUE(out.good()) << "cannot write " << path;
    return;
  }
  std::vector<float> ref(run.params.size());
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * sizeof(float)));
  ASSERT_TRUE(in.good()) << "no reference parameters in " << path << " (the host run comes first)";
  EXPECT_LE(worst(ref, run.params), 1e-5) << "the recovered device run differs from the recovered host run";
  std::printf(
      "[device_test] killed member, --shard %s R=2: %lld steps, recovered to %d ranks, largest "
      "difference to the host path's recovery %.2e\n",
      zero1 ? "optimizer" : "gradients", static_cast<long long>(run.steps), run.world,
      worst(ref, run.params));
  EXPECT_TRUE(api->misuse().empty());
}
