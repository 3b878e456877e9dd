#include "sinew/model/workload.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/model/loss.hpp"
#if SINEW_HAVE_CUDA
#include "sinew/model/cuda/workload.hpp"
#endif

namespace sinew::model {

ModelWorkload::ModelWorkload(Model net, std::unique_ptr<optim::Optimizer> optimizer,
                             const data::Dataset& train, const data::Dataset& test,
                             std::string optimizer_name)
    : net_(std::move(net)),
      optimizer_(std::move(optimizer)),
      optimizer_name_(std::move(optimizer_name)),
      train_(train),
      test_(test) {}

void ModelWorkload::optimizer_step(float lr) {
  if (!optimizer_)
    SINEW_THROW(InternalError,
                "the workload's optimiser step, but its state is sharded (the runtime steps it)");
  optimizer_->step(net_.params(), net_.grads(), lr);
}

std::string ModelWorkload::describe() const {
  return fmt::format("{} ({} parameters)", net_.spec(), net_.num_params());
}

float ModelWorkload::train(const workload::MicroBatch& batch, const workload::TrainHooks& hooks) {
  const std::size_t n = batch.indices.size();
  if (n == 0) {
    // The epoch's last step can leave a rank without samples: it contributes zero gradients.
    if (!batch.accumulate) std::fill(net_.grads().begin(), net_.grads().end(), 0.f);
    if (hooks.ready)
      for (const Slice& r : net_.grad_ready_order()) hooks.ready(r);
    return 0.f;
  }
  x_.resize(train_.dim(), static_cast<Eigen::Index>(n));
  labels_.resize(n);
  train_.gather(batch.indices, x_.data(), labels_.data());
  const Matrix& logits = net_.forward(x_);
  // Dividing by the step's global count makes the summed gradients the exact global mean.
  float loss = 0;
  if (hooks.teacher) {
    const workload::Teacher t = hooks.teacher();
    loss = distillation_loss(logits, labels_, t.logits, t.present, t.alpha, t.temperature, dlogits_,
                             batch.denominator);
  } else {
    loss = softmax_cross_entropy(logits, labels_, dlogits_, batch.denominator);
  }
  if (hooks.before_backward) hooks.before_backward();
  net_.backward(dlogits_, hooks.ready, batch.accumulate);
  return loss;
}

workload::EvalSums ModelWorkload::evaluate(std::span<const std::size_t> indices) {
  const std::size_t n = indices.size();
  workload::EvalSums sums;
  if (n == 0) return sums;
  x_.resize(test_.dim(), static_cast<Eigen::Index>(n));
  labels_.resize(n);
  test_.gather(indices, x_.data(), labels_.data());
  const Matrix& logits = net_.forward(x_);
  sums.loss = softmax_cross_entropy(logits, labels_, dlogits_, 1.0);
  sums.correct = count_correct(logits, labels_);
  return sums;
}

std::unique_ptr<workload::Workload> make_workload(const workload::ModelSpec& o, const data::DataSplit& data) {
  const data::Dataset& train = data.train;
  const data::Dataset& test = data.test;
  Model net = Model::build(o.model, {train.channels, train.height, train.width}, train.num_classes, o.seed);
  std::unique_ptr<ModelWorkload> work;
  if (o.shard_optimizer) {
    // The runtime holds the optimiser's state, by shards (train/shards.hpp), on the host: on a GPU too.
    optim::make_optimizer(o.optimizer, 0);  // its options are checked here
    work = std::make_unique<ModelWorkload>(std::move(net), nullptr, train, test, o.optimizer.name);
  } else {
    auto optimizer = optim::make_optimizer(o.optimizer, net.num_params());
    work = std::make_unique<ModelWorkload>(std::move(net), std::move(optimizer), train, test);
  }
  if (o.device == "cuda") {
#if SINEW_HAVE_CUDA
    return std::make_unique<cuda::DeviceWorkload>(std::move(work), o.optimizer);
#else
    SINEW_THROW(InvalidArgument, "--device cuda: this build of Sinew has no GPU support; use --device cpu");
#endif
  }
  return work;
}

}  // namespace sinew::model
