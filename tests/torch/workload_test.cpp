// pytorch::TorchWorkload without MPI: the module's tensors are views of the flat buffers, the hooks report
// every range once in backward's order, and the gradients hold the rank's share of the step's mean.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/torch/tensor_optimizer.hpp"
#include "sinew/torch/workload.hpp"

using sinew::Slice;
using sinew::pytorch::TorchWorkload;

namespace {

torch::nn::Sequential make_net() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::BatchNorm1d(3),
                               torch::nn::Functional(torch::relu), torch::nn::Linear(3, 2));
}

sinew::optim::OptimizerOptions sgd() {
  sinew::optim::OptimizerOptions o;
  o.momentum = 0;
  return o;
}

/// The mean cross-entropy's gradient of a plain copy of `net` on (x, y), flattened in module order.
torch::Tensor reference_grad(torch::nn::Sequential& net, const torch::Tensor& x, const torch::Tensor& y) {
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(net->clone());
  torch::nn::functional::cross_entropy(copy->forward(x), y).backward();
  std::vector<torch::Tensor> g;
  for (auto& p : copy->parameters()) g.push_back(p.grad().reshape({-1}));
  return torch::cat(g);
}

}  // namespace

TEST(TorchWorkload, ParametersAndBuffersAreViewsOfTheFlatBuffers) {
  auto net = make_net();
  std::vector<torch::Tensor> before;
  for (auto& p : net->parameters()) before.push_back(p.detach().clone());
  auto work = TorchWorkload::of(*net, sgd(), "net");
  ASSERT_EQ(work->params().size(), 4u * 3 + 3 + 3 + 3 + 3u * 2 + 2);
  std::size_t i = 0, offset = 0;
  for (auto& p : net->parameters()) {
    EXPECT_TRUE(torch::equal(p, before[i])) << "values kept";
    EXPECT_EQ(p.data_ptr<float>(), work->params().data() + offset) << "parameter " << i << " is a view";
    EXPECT_EQ(p.grad().data_ptr<float>(), work->grads().data() + offset) << ".grad " << i << " is a view";
    offset += static_cast<std::size_t>(p.numel());
    ++i;
  }
  // Writing the flat buffer is writing the module (what the optimiser and a state sync do).
  work->params()[0] = 42.f;
  EXPECT_EQ(net->parameters()[0].flatten()[0].item<float>(), 42.f);
  // BatchNorm's running statistics: two buffers of 3, named by the module.
  const auto buffers = work->buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].first, "1.running_mean");
  EXPECT_EQ(buffers[1].first, "1.running_var");
  net->train();
  net->forward(torch::randn({8, 4}));
  EXPECT_EQ(buffers[0].second[0], net->named_buffers()["1.running_mean"][0].item<float>());
  EXPECT_NE(buffers[0].second[0], 0.f) << "the forward pass updated the statistics in place";
  const auto views = work->views();
  ASSERT_EQ(views.size(), 6u);
  EXPECT_EQ(views[0].name, "0.weight");
  EXPECT_EQ(views[0].shape, (std::vector<std::size_t>{3, 4}));
}

TEST(TorchWorkload, HooksReportEveryRangeOnceInBackwardOrderWithTheRanksShare) {
  auto net = make_net();
  auto work = TorchWorkload::of(*net, sgd(), "net");
  std::vector<Slice> got;
  work->set_ready([&](Slice r) { got.push_back(r); });
  const auto x = torch::randn({6, 4});
  const auto y = torch::tensor({0, 1, 1, 0, 1, 0});
  const auto want = reference_grad(net, x, y) * (6.0 / 24.0);  // 6 of the step's 24 samples are here
  work->begin_micro_batch(0, 1, 6, 24);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  // Each parameter once, about last layer first: autograd finishes BatchNorm's bias before its weight, so
  // the order is the reversed module order only up to neighbours (which share a bucket).
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got.front(), work->ready_order().front());
  EXPECT_EQ(got.back(), work->ready_order().back());
  auto by_offset = [](Slice a, Slice b) { return a.offset < b.offset; };
  auto sorted = got, expected = work->ready_order();
  std::sort(sorted.begin(), sorted.end(), by_offset);
  std::sort(expected.begin(), expected.end(), by_offset);
  EXPECT_EQ(sorted, expected);
  const torch::Tensor grads = work->flat_grads();
  EXPECT_TRUE(torch::allclose(grads, want, 1e-5, 1e-6));
  // A second step: zeroed first, so nothing of the first remains; .grad set to None is taken back.
  for (auto& p : net->parameters()) p.mutable_grad() = torch::Tensor();
  got.clear();
  work->begin_micro_batch(0, 1, 6, 24);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  EXPECT_EQ(got.size(), 6u);
  EXPECT_TRUE(torch::allclose(work->flat_grads(), want, 1e-5, 1e-6));
}

TEST(TorchWorkload, MicroBatchesOfUnequalSizesAccumulateTheExactShare) {
  auto net = make_net();
  net->eval();  // BatchNorm by its running statistics: the micro-batches' split does not change the loss
  auto work = TorchWorkload::of(*net, sgd(), "net");
  std::size_t reports = 0;
  work->set_ready([&](Slice) { ++reports; });
  const auto x = torch::randn({8, 4});
  const auto y = torch::tensor({0, 1, 1, 0, 1, 0, 0, 1});
  // The step has 16 samples over all ranks; this rank's 8 come as micro-batches of 3 and 5.
  const auto want = reference_grad(net, x, y) * (8.0 / 16.0);
  work->begin_micro_batch(0, 2, 3, 16);
  torch::nn::functional::cross_entropy(net->forward(x.slice(0, 0, 3)), y.slice(0, 0, 3)).backward();
  EXPECT_EQ(reports, 0u) << "only the last micro-batch reports";
  work->begin_micro_batch(1, 2, 5, 16);
  torch::nn::functional::cross_entropy(net->forward(x.slice(0, 3, 8)), y.slice(0, 3, 8)).backward();
  EXPECT_EQ(reports, 6u);
  EXPECT_TRUE(torch::allclose(work->flat_grads(), want, 1e-5, 1e-6));
}

TEST(TorchWorkload, EmptyMicroBatchReportsEveryRangeWithZeroGradients) {
  auto net = make_net();
  auto work = TorchWorkload::of(*net, sgd(), "net");
  std::size_t reports = 0;
  work->set_ready([&](Slice) { ++reports; });
  work->begin_micro_batch(0, 1, 0, 16);
  work->skip_micro_batch();
  EXPECT_EQ(reports, 6u);
  EXPECT_EQ(work->flat_grads().abs().sum().item<float>(), 0.f);
}

TEST(TorchWorkload, OptimizerStepUpdatesTheModulesParameters) {
  auto net = make_net();
  auto work = TorchWorkload::of(*net, sgd(), "net");
  const auto before = net->parameters()[0].detach().clone();
  work->begin_micro_batch(0, 1, 4, 4);
  torch::nn::functional::cross_entropy(net->forward(torch::randn({4, 4})), torch::tensor({0, 1, 0, 1}))
      .backward();
  const auto grad = net->parameters()[0].grad().clone();
  work->optimizer_step(0.5f);
  EXPECT_TRUE(torch::allclose(net->parameters()[0].detach(), before - 0.5 * grad));
  EXPECT_EQ(work->optimizer_steps(), 1);
}

TEST(TorchWorkload, RefusesWhatItCannotTrain) {
  auto net = make_net();
  net->to(torch::kFloat64);
  try {
    (void)TorchWorkload::of(*net, sgd(), "net");
    FAIL() << "a float64 model was accepted";
  } catch (const sinew::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter '0.weight' is Double, not float32"), std::string::npos)
        << e.what();
  }
  torch::nn::Sequential frozen(torch::nn::Linear(2, 2));
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  EXPECT_THROW((void)TorchWorkload::of(*frozen, sgd(), "frozen"), sinew::InvalidArgument);
}

TEST(TorchWorkload, TwoBackwardPassesInOneMicroBatchAreAnError) {
  auto net = make_net();
  auto work = TorchWorkload::of(*net, sgd(), "net");
  work->begin_micro_batch(0, 1, 4, 4);
  const auto x = torch::randn({4, 4});
  torch::nn::functional::cross_entropy(net->forward(x), torch::tensor({0, 1, 0, 1})).backward();
  EXPECT_THROW(torch::nn::functional::cross_entropy(net->forward(x), torch::tensor({0, 1, 0, 1})).backward(),
               std::exception);
}

namespace {

/// Registers its layers out of forward's order (as a transformer layer registers its norms after its
/// linear layers): the module's order reversed is not backward's.
struct SwappedImpl : torch::nn::Module {
  SwappedImpl()
      : out(register_module("out", torch::nn::Linear(3, 2))),
        norm(register_module("norm", torch::nn::BatchNorm1d(3))),
        hidden(register_module("hidden", torch::nn::Linear(4, 3))),
        unused(register_module("unused", torch::nn::Linear(2, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::relu(norm(hidden(x)))); }
  torch::nn::Linear out;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear hidden, unused;
};
TORCH_MODULE(Swapped);

}  // namespace

TEST(TorchWorkload, ProbedReadyOrderLaysTheBuffersOutInBackwardsOrder) {
  torch::manual_seed(3);
  Swapped net;
  sinew::optim::OptimizerOptions momentum;  // sgd with momentum: a state buffer that must move too
  auto work = TorchWorkload::of(*net, momentum, "swapped");
  std::map<std::string, torch::Tensor> values, state;
  const auto mom = work->optimizer_state().at(0).second;
  for (std::size_t i = 0; i < mom.size(); ++i) mom[i] = static_cast<float>(i);  // a distinct value each
  for (const auto& v : work->views()) {
    values[v.name] = net->named_parameters()[v.name].detach().clone();
    state[v.name] = torch::arange(static_cast<double>(v.offset), static_cast<double>(v.offset + v.count()));
  }
  const auto statistics = net->norm->running_mean.clone();
  const auto x = torch::randn({8, 4});
  const auto y = torch::tensor({0, 1, 1, 0, 1, 0, 0, 1});
  const std::size_t moved =
      work->probe_ready_order([&] { torch::nn::functional::cross_entropy(net->forward(x), y).backward(); });
  EXPECT_GT(moved, 0u);
  EXPECT_TRUE(torch::equal(net->norm->running_mean, statistics)) << "the probe is not training";
  EXPECT_EQ(work->flat_grads().abs().sum().item<float>(), 0.f);
  // Backward's order walks the buffer from its end, one contiguous range after the other; the parameter
  // without a gradient comes last.
  const auto order = work->ready_order();
  ASSERT_EQ(order.size(), 8u);
  EXPECT_EQ(order.front().end(), work->params().size());
  for (std::size_t k = 1; k < order.size(); ++k) EXPECT_EQ(order[k].end(), order[k - 1].offset) << k;
  const auto views = work->views();
  EXPECT_EQ(views[0].name.substr(0, 7), "unused.");
  EXPECT_EQ(views.back().name.substr(0, 4), "out.");
  // Every parameter kept its value and its momentum, and is a view of its new range.
  for (std::size_t k = 0; k < views.size(); ++k) {
    const auto& v = views[k];
    if (k > 0) {
      EXPECT_EQ(views[k - 1].offset + views[k - 1].count(), v.offset) << "views in flat order";
    }
    const auto p = net->named_parameters()[v.name];
    EXPECT_EQ(p.data_ptr<float>(), work->params().data() + v.offset) << v.name;
    EXPECT_TRUE(torch::equal(p.detach(), values[v.name])) << v.name;
    const auto m = torch::from_blob(mom.data() + v.offset, {static_cast<std::int64_t>(v.count())});
    EXPECT_TRUE(torch::equal(m.to(torch::kDouble), state[v.name])) << v.name;
  }
  // A step reports the new ranges in the new order, and autograd accumulates into them.
  std::vector<Slice> got;
  work->set_ready([&](Slice r) { got.push_back(r); });
  work->begin_micro_batch(0, 1, 8, 8);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  EXPECT_EQ(std::vector<Slice>(got.begin(), got.end()), std::vector<Slice>(order.begin(), order.end() - 2));
  const auto w = net->hidden->weight;
  EXPECT_EQ(w.grad().data_ptr<float>(), work->grads().data() + (w.data_ptr<float>() - work->params().data()));
  EXPECT_GT(w.grad().abs().sum().item<float>(), 0.f);
  // A second probe finds the order it laid out: nothing moves.
  EXPECT_EQ(
      work->probe_ready_order([&] { torch::nn::functional::cross_entropy(net->forward(x), y).backward(); }),
      0u);
}

TEST(TorchWorkload, ProbeKeepsTheLayoutUnderAnOptimizerThatCannotFollow) {
  torch::manual_seed(3);
  Swapped net;
  auto work = TorchWorkload::of(*net, sgd(), "swapped");
  const auto before = work->views();
  sinew::pytorch::ExternalOptimizer o;
  o.name = "theirs";
  o.step = [](float) {};
  o.steps = [] { return std::int64_t{0}; };
  o.set_steps = [](std::int64_t) {};
  work->use_optimizer(o);
  const auto x = torch::randn({8, 4});
  EXPECT_EQ(work->probe_ready_order([&] { net->forward(x).sum().backward(); }), 0u);
  EXPECT_EQ(work->views()[0].name, before[0].name);
  // With a relayout function it moves, and is told.
  int told = 0;
  o.relayout = [&] { ++told; };
  work->use_optimizer(o);
  EXPECT_GT(work->probe_ready_order([&] { net->forward(x).sum().backward(); }), 0u);
  EXPECT_EQ(told, 1);
}

TEST(TensorOptimizer, EqualsSinewsFusedOptimizers) {
  for (const char* which : {"sgd", "sgd-nesterov", "sgd-plain", "adam"}) {
    sinew::optim::OptimizerOptions o;
    o.name = std::string(which).substr(0, 4) == "adam" ? "adam" : "sgd";
    o.weight_decay = 0.01f;
    o.nesterov = std::string(which) == "sgd-nesterov";
    if (std::string(which) == "sgd-plain") o.momentum = 0;
    torch::manual_seed(2);
    const auto start = torch::randn({50});
    auto p = start.clone();
    std::vector<float> host(start.data_ptr<float>(), start.data_ptr<float>() + 50);
    sinew::pytorch::TensorOptimizer t(o, p);
    const auto fused = sinew::optim::make_optimizer(o, 50);
    for (int step = 0; step < 5; ++step) {
      const auto g = torch::randn({50});
      t.step(p, g, 0.1f);
      fused->step(host, std::span<const float>(g.data_ptr<float>(), 50), 0.1f);
    }
    EXPECT_EQ(t.steps(), 5);
    for (std::size_t i = 0; i < 50; ++i)
      ASSERT_NEAR(p[static_cast<std::int64_t>(i)].item<float>(), host[i], 1e-6f) << which << " element " << i;
    ASSERT_EQ(t.state().size(), fused->state().size()) << which;
    for (std::size_t k = 0; k < t.state().size(); ++k) EXPECT_EQ(t.state()[k].first, fused->state()[k].first);
  }
}

namespace {

/// Hands out distinct fake event handles and counts the records (the device path's reports, without CUDA).
class CountingEvents final : public sinew::pytorch::ReadyEvents {
 public:
  explicit CountingEvents(std::vector<std::size_t>& log) : log_(log) {}
  CUevent_st* record(std::size_t i) override {
    log_.push_back(i);
    return reinterpret_cast<CUevent_st*>(slots_ + i);  // NOLINT: a handle that is never dereferenced
  }

 private:
  std::vector<std::size_t>& log_;
  char slots_[64] = {};
};

}  // namespace

TEST(TorchWorkload, OnADeviceReportsEventsAndKeepsAHostRecord) {
  auto net = make_net();
  std::vector<sinew::pytorch::NamedTensor> params, buffers;
  for (const auto& p : net->named_parameters()) params.push_back({p.key(), p.value()});
  for (const auto& b : net->named_buffers())
    if (b.value().scalar_type() == torch::kFloat) buffers.push_back({b.key(), b.value()});
  std::vector<std::size_t> recorded;
  sinew::pytorch::Device device{0, 1, std::make_unique<CountingEvents>(recorded)};
  TorchWorkload work(std::move(params), std::move(buffers), sgd(), "net", std::move(device));
  EXPECT_TRUE(work.on_device());
  EXPECT_EQ(work.device(), 0);
  EXPECT_EQ(work.attach_device(0), work.flat_grads().data_ptr<float>());
  EXPECT_THROW((void)work.attach_device(1), sinew::InvalidArgument);
  // The host record is a copy: training writes the device buffers, to_host() brings them over.
  EXPECT_NE(work.params().data(), work.flat_params().data_ptr<float>());
  std::vector<std::pair<Slice, CUevent_st*>> got;
  work.set_device_ready([&](Slice r, CUevent_st* e) { got.emplace_back(r, e); });
  work.begin_micro_batch(0, 1, 4, 8);
  torch::nn::functional::cross_entropy(net->forward(torch::randn({4, 4})), torch::tensor({0, 1, 0, 1}))
      .backward();
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(recorded.size(), 6u);
  EXPECT_EQ(got.front().first, work.ready_order().front());
  const float before = work.params()[0];
  work.optimizer_step(1.f);
  EXPECT_EQ(work.params()[0], before) << "the host record waits for to_host()";
  work.to_host();
  EXPECT_EQ(work.params()[0], work.flat_params()[0].item<float>());
  EXPECT_NE(work.params()[0], before);
  // A state sync writes the host record; to_device() makes it the model's.
  work.params()[0] = 7.f;
  work.buffers()[0].second[0] = 3.f;
  work.to_device();
  EXPECT_EQ(net->parameters()[0].flatten()[0].item<float>(), 7.f);
  EXPECT_EQ(net->named_buffers()["1.running_mean"][0].item<float>(), 3.f);
}
