// The device model against the host model: loss, gradients (also accumulated), the ranges and order of the
// ready callbacks, the fused optimisers, evaluation and the state round trip. Tolerances are those stated
// in model/cuda/device_model.hpp.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "sinew/core/error.hpp"
#include "sinew/cuda/check.hpp"
#include "sinew/model/cuda/device_model.hpp"
#include "sinew/model/loss.hpp"
#include "sinew/model/model.hpp"
#include "sinew/optim/optimizer.hpp"

namespace sinew::model::cuda {
namespace {

using test::expect_close;

constexpr Shape kInput{1, 6, 5};  // 30 inputs
constexpr int kClasses = 7;

struct Batch {
  Matrix x;
  std::vector<std::int32_t> labels;
};

Batch random_batch(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> label(0, kClasses - 1);
  Batch b;
  b.x.resize(kInput.size(), static_cast<Eigen::Index>(n));
  for (Eigen::Index i = 0; i < b.x.size(); ++i) b.x.data()[i] = normal(gen);
  for (std::size_t i = 0; i < n; ++i) b.labels.push_back(label(gen));
  return b;
}

/// Host forward + loss + backward, as the trainer does it.
float host_step(Model& m, const Batch& b, double denominator, bool accumulate, std::vector<Slice>* ranges) {
  Matrix dlogits;
  const float loss = softmax_cross_entropy(m.forward(b.x), b.labels, dlogits, denominator);
  m.backward(
      dlogits,
      [&](Slice r) {
        if (ranges != nullptr) ranges->push_back(r);
      },
      accumulate);
  return loss;
}

std::vector<float> params_of(DeviceModel& d) {
  std::vector<float> v(d.num_params());
  d.download_params(v);
  return v;
}

std::vector<float> grads_of(DeviceModel& d) {
  std::vector<float> v(d.num_params());
  d.download_grads(v);
  return v;
}

TEST(DeviceModelCheck, RefusesTheCnnWithAClearMessage) {
  // No GPU needed: the constructor makes this check before it touches the device.
  const Model cnn = Model::build("cnn", Shape{1, 8, 8}, 10, 1);
  try {
    check_supported(cnn);
    FAIL() << "cnn accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(e.message().find(
                  "--device cuda supports the models logreg and mlp[:H1,...]; cnn runs on --device cpu "
                  "only"),
              std::string::npos)
        << e.message();
  }
  EXPECT_NO_THROW(check_supported(Model::build("mlp:32,16", kInput, kClasses, 1)));
  EXPECT_NO_THROW(check_supported(Model::build("logreg", kInput, kClasses, 1)));
  EXPECT_THROW((void)DeviceModel(cnn, optim::OptimizerOptions{}), InvalidArgument);
}

class DeviceModelTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { SINEW_REQUIRE_GPU(); }
};

TEST_P(DeviceModelTest, LossGradientsAndReadyRangesMatchTheHost) {
  Model host = Model::build(GetParam(), kInput, kClasses, 7);
  DeviceModel dev(host, optim::OptimizerOptions{});
  ASSERT_EQ(dev.num_params(), host.num_params());
  EXPECT_EQ(params_of(dev), std::vector<float>(host.params().begin(), host.params().end()));

  const Batch b = random_batch(37, 1);
  const double denominator = 100;  // the global batch: larger than this rank's 37 samples
  std::vector<Slice> host_ranges;
  const float host_loss = host_step(host, b, denominator, false, &host_ranges);
  EXPECT_EQ(host_ranges, host.grad_ready_order());

  std::vector<Slice> dev_ranges;
  const float dev_loss =
      dev.train_batch(b.x.data(), b.labels.data(), 37, denominator, false, [&](Slice r, cudaEvent_t e) {
        EXPECT_NE(e, nullptr);
        dev_ranges.push_back(r);
      });
  EXPECT_EQ(dev_ranges, host.grad_ready_order());
  EXPECT_NEAR(dev_loss, host_loss, 1e-5f * std::abs(host_loss));
  expect_close(grads_of(dev), host.grads(), 1e-4f, 1e-5f, 0.f, "gradients");

  // Accumulating a second micro-batch adds to the gradients on both sides.
  const Batch b2 = random_batch(20, 2);
  const float host_loss2 = host_step(host, b2, denominator, true, nullptr);
  const float dev_loss2 = dev.train_batch(b2.x.data(), b2.labels.data(), 20, denominator, true);
  EXPECT_NEAR(dev_loss2, host_loss2, 1e-5f * std::abs(host_loss2));
  expect_close(grads_of(dev), host.grads(), 1e-4f, 1e-5f, 0.f, "accumulated gradients");

  // denominator 0 means this batch's size, as in softmax_cross_entropy.
  const float host_loss3 = host_step(host, b2, 0, false, nullptr);
  const float dev_loss3 = dev.train_batch(b2.x.data(), b2.labels.data(), 20, 0, false);
  EXPECT_NEAR(dev_loss3, host_loss3, 1e-5f * std::abs(host_loss3));
  expect_close(grads_of(dev), host.grads(), 1e-4f, 1e-5f, 0.f, "gradients, local denominator");
}

TEST_P(DeviceModelTest, EmptyBatchZeroesOrKeepsTheGradientsAndReportsEveryRange) {
  Model host = Model::build(GetParam(), kInput, kClasses, 3);
  DeviceModel dev(host, optim::OptimizerOptions{});
  const Batch b = random_batch(9, 4);
  (void)dev.train_batch(b.x.data(), b.labels.data(), 9, 9, false);
  const auto before = grads_of(dev);
  std::vector<Slice> ranges;
  EXPECT_EQ(
      dev.train_batch(nullptr, nullptr, 0, 64, true, [&](Slice r, cudaEvent_t) { ranges.push_back(r); }),
      0.f);
  EXPECT_EQ(ranges, host.grad_ready_order());
  EXPECT_EQ(grads_of(dev), before);
  (void)dev.train_batch(nullptr, nullptr, 0, 64, false);
  EXPECT_EQ(grads_of(dev), std::vector<float>(dev.num_params(), 0.f));
  (void)dev.train_batch(b.x.data(), b.labels.data(), 9, 9, false);
  dev.zero_grads();
  EXPECT_EQ(grads_of(dev), std::vector<float>(dev.num_params(), 0.f));
}

TEST_P(DeviceModelTest, BadLabelsAndDenominatorsAreRefused) {
  Model host = Model::build(GetParam(), kInput, kClasses, 3);
  DeviceModel dev(host, optim::OptimizerOptions{});
  Batch b = random_batch(5, 4);
  b.labels[3] = kClasses;
  EXPECT_THROW((void)dev.train_batch(b.x.data(), b.labels.data(), 5, 5, false), DataError);
  EXPECT_THROW((void)dev.evaluate(b.x.data(), b.labels.data(), 5), DataError);
  b.labels[3] = 0;
  EXPECT_THROW((void)dev.train_batch(b.x.data(), b.labels.data(), 5, -1, false), InvalidArgument);
  EXPECT_THROW(dev.optimizer_step(-0.1f), InvalidArgument);
}

TEST_P(DeviceModelTest, EvaluateMatchesTheHostLossAndAccuracy) {
  Model host = Model::build(GetParam(), kInput, kClasses, 11);
  DeviceModel dev(host, optim::OptimizerOptions{});
  const Batch b = random_batch(500, 5);
  Matrix dlogits;
  const Matrix& logits = host.forward(b.x);
  const float host_sum = softmax_cross_entropy(logits, b.labels, dlogits, 1.0);  // divided by 1: the sum
  const std::size_t host_correct = count_correct(logits, b.labels);
  const auto [dev_sum, dev_correct] = dev.evaluate(b.x.data(), b.labels.data(), 500);
  EXPECT_NEAR(dev_sum, host_sum, 1e-5 * host_sum);
  EXPECT_EQ(dev_correct, host_correct);
  EXPECT_EQ(dev.evaluate(nullptr, nullptr, 0), (std::pair<double, std::size_t>{0.0, 0}));
}

TEST(DeviceModelLarge, FashionMnistSizedMlpMatchesTheHostAcrossBufferGrowth) {
  SINEW_REQUIRE_GPU();
  const Shape input{1, 28, 28};
  Model host = Model::build("mlp:256,128", input, 10, 17);
  DeviceModel dev(host, optim::OptimizerOptions{});
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> pixel(0.f, 1.f);
  std::uniform_int_distribution<int> label(0, 9);
  const auto batch = [&](std::size_t n) {
    Batch b;
    b.x.resize(input.size(), static_cast<Eigen::Index>(n));
    for (Eigen::Index i = 0; i < b.x.size(); ++i) b.x.data()[i] = pixel(gen) < 0.5f ? 0.f : pixel(gen);
    for (std::size_t i = 0; i < n; ++i) b.labels.push_back(label(gen));
    return b;
  };
  // 64 samples, then an evaluation of 300 (the buffers grow), then 64 again into the grown buffers.
  for (const std::size_t n : {64, 300, 64}) {
    const Batch b = batch(n);
    if (n == 300) {
      Matrix dlogits;
      const Matrix& logits = host.forward(b.x);
      const float host_sum = softmax_cross_entropy(logits, b.labels, dlogits, 1.0);
      const auto [dev_sum, dev_correct] = dev.evaluate(b.x.data(), b.labels.data(), n);
      EXPECT_NEAR(dev_sum, host_sum, 1e-5 * host_sum);
      EXPECT_EQ(dev_correct, count_correct(logits, b.labels));
      continue;
    }
    const float host_loss = host_step(host, b, 256, false, nullptr);
    const float dev_loss = dev.train_batch(b.x.data(), b.labels.data(), n, 256, false);
    EXPECT_NEAR(dev_loss, host_loss, 1e-5f * std::abs(host_loss));
    expect_close(grads_of(dev), host.grads(), 1e-4f, 1e-5f, 0.f, "gradients");
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceModelTest, testing::Values("mlp:32,16", "logreg"),
                         [](const testing::TestParamInfo<std::string>& p) {
                           return p.param == "logreg" ? std::string("logreg") : std::string("mlp");
                         });

/// Five optimiser steps from the same gradients (copied into both models) on host and device.
void expect_same_optimizer(const optim::OptimizerOptions& opts) {
  Model host = Model::build("mlp:32,16", kInput, kClasses, 21);
  DeviceModel dev(host, opts);
  auto opt = optim::make_optimizer(opts, host.num_params());
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.f, 0.1f);
  std::vector<float> g(host.num_params());
  for (int step = 0; step < 5; ++step) {
    for (float& v : g) v = normal(gen);
    for (std::size_t i = 0; i < g.size(); i += 11) g[i] = 0.f;  // sparse entries too
    std::copy(g.begin(), g.end(), host.grads().begin());
    SINEW_CUDA(cudaMemcpy(dev.grads(), g.data(), g.size() * sizeof(float), cudaMemcpyHostToDevice));
    const float lr = 0.05f * static_cast<float>(step + 1);
    opt->step(host.params(), host.grads(), lr);
    dev.optimizer_step(lr);
  }
  EXPECT_EQ(dev.steps(), 5);
  expect_close(params_of(dev), host.params(), 1e-5f, 0.f, 1e-6f, "parameters");

  // The optimiser state too, through download().
  Model back = host.clone();
  auto opt_back = optim::make_optimizer(opts, host.num_params());
  dev.download(back, *opt_back);
  EXPECT_EQ(opt_back->steps(), 5);
  const auto want = opt->state();
  const auto got = opt_back->state();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t k = 0; k < want.size(); ++k) {
    EXPECT_EQ(got[k].first, want[k].first);
    expect_close(got[k].second, want[k].second, 1e-5f, 0.f, 1e-7f, want[k].first.c_str());
  }
}

TEST(DeviceOptimizer, SgdPlain) {
  SINEW_REQUIRE_GPU();
  optim::OptimizerOptions o;
  o.momentum = 0.f;
  expect_same_optimizer(o);
}

TEST(DeviceOptimizer, SgdMomentumWithWeightDecay) {
  SINEW_REQUIRE_GPU();
  optim::OptimizerOptions o;
  o.momentum = 0.9f;
  o.weight_decay = 1e-2f;
  expect_same_optimizer(o);
}

TEST(DeviceOptimizer, SgdNesterov) {
  SINEW_REQUIRE_GPU();
  optim::OptimizerOptions o;
  o.momentum = 0.8f;
  o.nesterov = true;
  o.weight_decay = 5e-3f;
  expect_same_optimizer(o);
}

TEST(DeviceOptimizer, AdamWithBiasCorrection) {
  SINEW_REQUIRE_GPU();
  optim::OptimizerOptions o;
  o.name = "adam";
  o.weight_decay = 1e-3f;
  expect_same_optimizer(o);
}

TEST(DeviceOptimizer, RefusesBadOptions) {
  // Checked before the GPU is touched, with the host optimiser's messages.
  const Model host = Model::build("logreg", kInput, kClasses, 1);
  optim::OptimizerOptions o;
  o.name = "lamb";
  EXPECT_THROW((void)DeviceModel(host, o), InvalidArgument);
  o.name = "sgd";
  o.momentum = 0.f;
  o.nesterov = true;
  EXPECT_THROW((void)DeviceModel(host, o), InvalidArgument);
}

TEST(DeviceModelState, DownloadUploadRoundTrip) {
  SINEW_REQUIRE_GPU();
  optim::OptimizerOptions opts;
  opts.name = "adam";
  Model host = Model::build("mlp:32,16", kInput, kClasses, 5);
  DeviceModel dev(host, opts);
  for (int step = 0; step < 3; ++step) {
    const Batch b = random_batch(16, 40 + static_cast<unsigned>(step));
    (void)dev.train_batch(b.x.data(), b.labels.data(), 16, 16, false);
    dev.optimizer_step(1e-2f);
  }
  // Device -> host: parameters, Adam's m and v, steps.
  Model saved = Model::build("mlp:32,16", kInput, kClasses, 99);
  auto opt = optim::make_optimizer(opts, saved.num_params());
  dev.download(saved, *opt);
  EXPECT_EQ(opt->steps(), 3);
  EXPECT_EQ(std::vector<float>(saved.params().begin(), saved.params().end()), params_of(dev));

  // Host -> a fresh device model (another initialisation): the same state, so the same next step.
  DeviceModel other(Model::build("mlp:32,16", kInput, kClasses, 123), opts);
  other.upload(saved, *opt);
  EXPECT_EQ(other.steps(), 3);
  EXPECT_EQ(params_of(other), params_of(dev));
  const Batch b = random_batch(16, 77);
  const float l1 = dev.train_batch(b.x.data(), b.labels.data(), 16, 16, false);
  const float l2 = other.train_batch(b.x.data(), b.labels.data(), 16, 16, false);
  EXPECT_EQ(l1, l2);
  dev.optimizer_step(1e-2f);
  other.optimizer_step(1e-2f);
  EXPECT_EQ(params_of(other), params_of(dev));  // same GPU, same kernels: bit for bit

  // A host optimiser that does not match is refused.
  auto sgd = optim::make_optimizer(optim::OptimizerOptions{}, saved.num_params());
  EXPECT_THROW(dev.download(saved, *sgd), InvalidArgument);
  Model wrong = Model::build("mlp:8", kInput, kClasses, 1);
  EXPECT_THROW(dev.upload(wrong, *opt), InvalidArgument);
}

// A sharded optimiser state (--shard optimizer|gradients on a GPU): the device holds no state, the runtime
// copies ranges of the gradients down and of the parameters up (train/shards.hpp, DeviceWorkload).
TEST(DeviceModelState, WithoutOptimizerStateRangesMoveAndItsOwnStepIsRefused) {
  SINEW_REQUIRE_GPU();
  optim::OptimizerOptions opts;
  opts.name = "adam";
  Model host = Model::build("mlp:32,16", kInput, kClasses, 5);
  DeviceModel dev(host, opts, /*optimizer_state=*/false);
  EXPECT_FALSE(dev.has_optimizer_state());
  const Batch b = random_batch(16, 40);
  (void)dev.train_batch(b.x.data(), b.labels.data(), 16, 16, false);
  const std::vector<float> grads = grads_of(dev);
  const std::size_t n = dev.num_params(), lo = n / 3, count = n / 2;
  std::vector<float> part(count);
  dev.download_grads(part, lo);
  EXPECT_EQ(part, std::vector<float>(grads.begin() + static_cast<std::ptrdiff_t>(lo),
                                     grads.begin() + static_cast<std::ptrdiff_t>(lo + count)));
  std::vector<float> want = params_of(dev);
  for (std::size_t i = 0; i < count; ++i) part[i] = static_cast<float>(i) * 0.5f;
  dev.upload_params(part, lo);
  std::copy(part.begin(), part.end(), want.begin() + static_cast<std::ptrdiff_t>(lo));
  EXPECT_EQ(params_of(dev), want) << "only the range changed";
  EXPECT_THROW(dev.upload_params(part, n - 1), InvalidArgument) << "past the end";
  EXPECT_THROW(dev.optimizer_step(1e-2f), InternalError);
  auto opt = optim::make_optimizer(opts, host.num_params());
  EXPECT_THROW(dev.download(host, *opt), InternalError);
}

}  // namespace
}  // namespace sinew::model::cuda
