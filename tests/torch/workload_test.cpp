// pytorch::TorchWorkload without MPI: the module's tensors are views of the flat buffers, the hooks report
// every range once in backward's order, and the gradients hold the rank's share of the step's mean.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "sinew/core/error.hpp"
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
