// A libtorch model defined in C++, trained with Sinew's elastic runtime (src/sinew/torch): the C++ twin of
// examples/torch/train_resnet.py.
//
//   sinew-run -n 4 -- sinew-torch-cnn [sinew-train options]
//
// Data: --dataset (Fashion-MNIST from Debian's package by default), loaded by Sinew. If a rank dies, the
// others recover in place, redo the step and spawn a replacement running this same program.
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/torch/job.hpp"
#include "sinew/torch/workload.hpp"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl(int channels, int height, int width, int classes)
      : conv1(register_module("conv1",
                              torch::nn::Conv2d(torch::nn::Conv2dOptions(channels, 16, 3).padding(1)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(16))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(32))),
        fc(register_module("fc", torch::nn::Linear(32 * (height / 4) * (width / 4), classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    return fc(x.flatten(1));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

/// The samples `idx` of a data set as a batch: N x C x H x W features and int64 labels.
std::pair<torch::Tensor, torch::Tensor> batch(const sinew::data::Dataset& d,
                                              std::span<const std::size_t> idx) {
  auto x = torch::empty({static_cast<long>(idx.size()), d.channels, d.height, d.width});
  auto y = torch::empty({static_cast<long>(idx.size())}, torch::kLong);
  float* xp = x.data_ptr<float>();
  const auto dim = static_cast<std::size_t>(d.dim());
  for (std::size_t i = 0; i < idx.size(); ++i) {
    const auto s = d.sample(idx[i]);
    std::copy(s.begin(), s.end(), xp + i * dim);
    y[static_cast<long>(i)] = d.labels[idx[i]];
  }
  return {x, y};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    torch::set_num_threads(1);
    sinew::pytorch::Job job({argv + 1, argv + argc}, {argv, argv + argc});
    if (!job.help().empty()) {
      std::fputs(job.help().c_str(), stdout);
      return 0;
    }
    const sinew::data::DataSplit data = job.dataset();
    const auto& train = data.train;
    const auto& test = data.test;
    torch::manual_seed(0);
    Net net(train.channels, train.height, train.width, train.num_classes);
    auto work = sinew::pytorch::TorchWorkload::of(*net, job.optimizer(), "cnn (libtorch)");

    sinew::pytorch::Steps steps;
    steps.train = [&](std::span<const std::size_t> idx) {
      auto [x, y] = batch(train, idx);
      auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      return loss.item<double>();
    };
    steps.evaluate = [&](std::size_t first, std::size_t last) {
      torch::NoGradGuard no_grad;
      net->eval();
      std::vector<std::size_t> idx;
      for (std::size_t i = first; i < last; ++i) idx.push_back(i);
      auto [x, y] = batch(test, idx);
      auto out = net->forward(x);
      sinew::workload::EvalSums sums;
      sums.loss = torch::nn::functional::cross_entropy(
                      out, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
      sums.correct = static_cast<std::size_t>(out.argmax(1).eq(y).sum().item<long>());
      net->train();
      return sums;
    };
    steps.test_size = test.size();
    const sinew::train::Summary s = job.run(*work, train.size(), steps);
    if (job.rank() == 0 && !s.left) {
      std::printf(
          "[sinew-torch-cnn] done: test accuracy %.2f%% after %d epochs (%lld steps, %d failures "
          "recovered)\n",
          100 * s.test_accuracy, s.epochs, static_cast<long long>(s.steps), s.failures);
    }
    return job.exit(s.exit_code());
  } catch (const sinew::Error& e) {
    std::fprintf(stderr, "sinew-torch-cnn: %s\n", e.what());
    return static_cast<int>(e.exit_code());
  }
}
