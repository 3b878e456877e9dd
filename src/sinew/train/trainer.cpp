#include "sinew/train/trainer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "sinew/comm/bucketer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/model/loss.hpp"
#include "sinew/model/model.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/optim/lr_schedule.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/train/metrics.hpp"

namespace sinew::train {

using model::Matrix;

namespace {
data::DatasetOptions dataset_options(const Config& c) {
  data::DatasetOptions o;
  o.name = c.dataset;
  o.data_dir = c.data_dir;
  o.seed = c.seed;
  o.limit_train = c.limit_train;
  o.limit_test = c.limit_test;
  return o;
}
}  // namespace

struct Trainer::Impl {
  Config cfg;
  std::unique_ptr<comm::mpi::MpiBackend> backend;
  data::DataSplit data;
  model::Model net;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::LrSchedule> schedule;
  std::unique_ptr<comm::GradientBucketer> bucketer;
  data::DistributedSampler sampler;
  MetricsWriter metrics;
  comm::Options op;
  std::int64_t steps_per_epoch = 0;
  std::int64_t total_steps = 0;

  Impl(Config c, const mpi::Communicator& world)
      : cfg(std::move(c)),
        backend(std::make_unique<comm::mpi::MpiBackend>(world)),
        data(data::load_dataset(dataset_options(cfg))),
        net(model::Model::build(cfg.model, {data.train.channels, data.train.height, data.train.width},
                                data.train.num_classes, cfg.seed)),
        sampler(data.train.size(), cfg.seed, /*shuffle=*/true) {
    op.timeout = std::chrono::milliseconds(cfg.timeout_ms);
    if (backend->rank() == 0 && !cfg.metrics.empty()) metrics = MetricsWriter(cfg.metrics);
    // Same seed gives the same initial weights everywhere; the broadcast makes it a guarantee, as DDP does.
    backend->broadcast_sync(comm::Buffer::of(net.params()), 0, op);
    optimizer = optim::make_optimizer({cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.nesterov},
                                      net.num_params());
    steps_per_epoch = static_cast<std::int64_t>(sampler.steps_left(backend->size(), cfg.batch_size));
    total_steps = steps_per_epoch * cfg.epochs;
    if (cfg.max_steps > 0) total_steps = std::min(total_steps, cfg.max_steps);
    optim::LrScheduleOptions so;
    so.base_lr = cfg.lr;
    so.warmup_steps = std::min(cfg.warmup_steps, total_steps / 2);
    so.kind = cfg.lr_schedule;
    so.step_size = cfg.lr_step_size;
    so.gamma = cfg.lr_gamma;
    so.total_steps = total_steps;
    schedule = std::make_unique<optim::LrSchedule>(so);
    std::vector<comm::Range> ranges;
    for (const auto& r : net.grad_ready_order()) ranges.push_back({r.offset, r.count});
    comm::BucketOptions bo;
    bo.bucket_bytes = static_cast<std::size_t>(cfg.bucket_mb * (1 << 20));
    bo.overlap = cfg.overlap;
    bo.op = op;
    bucketer = std::make_unique<comm::GradientBucketer>(*backend, net.grads(), ranges, bo);
  }

  /// Test-set loss and accuracy; every rank evaluates a contiguous shard, the sums are reduced.
  std::pair<double, double> evaluate() {
    const auto& test = data.test;
    const std::size_t n = test.size();
    const auto r = static_cast<std::size_t>(backend->rank());
    const auto w = static_cast<std::size_t>(backend->size());
    const std::size_t begin = n * r / w, end = n * (r + 1) / w;
    constexpr std::size_t kChunk = 1024;
    Matrix x, dlogits;
    std::vector<std::int32_t> labels;
    std::vector<std::size_t> idx;
    double sums[3] = {0, 0, static_cast<double>(end - begin)};  // loss sum, correct, count
    for (std::size_t s = begin; s < end; s += kChunk) {
      const std::size_t m = std::min(kChunk, end - s);
      idx.resize(m);
      for (std::size_t i = 0; i < m; ++i) idx[i] = s + i;
      x.resize(test.dim(), static_cast<Eigen::Index>(m));
      labels.resize(m);
      test.gather(idx, x.data(), labels.data());
      const Matrix& logits = net.forward(x);
      sums[0] += model::softmax_cross_entropy(logits, labels, dlogits, 1.0);
      sums[1] += static_cast<double>(model::count_correct(logits, labels));
    }
    backend->allreduce_sync(comm::Buffer::of(std::span<double>(sums)), comm::ReduceOp::kSum, op);
    return {sums[0] / std::max(sums[2], 1.0), sums[1] / std::max(sums[2], 1.0)};
  }

  Summary run() {
    const int rank = backend->rank(), world = backend->size();
    Summary sum;
    const auto t0 = Clock::now();
    auto last_progress = t0;
    Matrix x, dlogits;
    std::vector<std::int32_t> labels;
    std::int64_t step = 0;
    double window_loss = 0, window_step_ms = 0, window_comm_ms = 0, total_step_ms = 0, total_comm_ms = 0;
    std::int64_t window_steps = 0, window_samples = 0;
    if (rank == 0) {
      spdlog::info(
          "training {} ({} parameters) on {} ({} train / {} test samples), {} ranks x batch {}, {} steps",
          cfg.model, net.num_params(), cfg.dataset, data.train.size(), data.test.size(), world,
          cfg.batch_size, total_steps);
      metrics.write({{"event", "start"},
                     {"world_size", world},
                     {"model", cfg.model},
                     {"dataset", cfg.dataset},
                     {"params", net.num_params()},
                     {"batch_size", cfg.batch_size},
                     {"steps", total_steps},
                     {"buckets", bucketer->num_buckets()},
                     {"mpi", mpi::library_version()},
                     {"ulfm", mpi::ulfm_enabled()}});
    }
    for (int epoch = 0; epoch < cfg.epochs && step < total_steps; ++epoch) {
      sampler.start_epoch(epoch);
      while (!sampler.epoch_done() && step < total_steps) {
        const auto ts = Clock::now();
        const auto batch = sampler.peek(rank, world, cfg.batch_size);
        const auto n = static_cast<Eigen::Index>(batch.indices.size());
        const float lr = schedule->lr(step);
        float local_loss = 0;
        auto ready = [this](model::ParamRange r) { bucketer->mark_ready({r.offset, r.count}); };
        if (n > 0) {
          x.resize(data.train.dim(), n);
          labels.resize(batch.indices.size());
          data.train.gather(batch.indices, x.data(), labels.data());
          const Matrix& logits = net.forward(x);
          // Dividing by the global count makes the summed gradients the exact global mean.
          local_loss =
              model::softmax_cross_entropy(logits, labels, dlogits, static_cast<double>(batch.global_count));
          net.backward(dlogits, ready);
        } else {
          // The epoch's last step can leave a rank without samples: it contributes zero gradients.
          std::fill(net.grads().begin(), net.grads().end(), 0.f);
          for (const auto& r : net.grad_ready_order()) ready(r);
        }
        bucketer->finish();
        optimizer->step(net.params(), net.grads(), lr);
        sampler.advance(batch.global_count);
        ++step;
        const double step_ms = seconds_since(ts) * 1e3;
        window_step_ms += step_ms;
        window_comm_ms += bucketer->last_comm_ms();
        total_step_ms += step_ms;
        total_comm_ms += bucketer->last_comm_ms();
        window_loss += local_loss;
        window_samples += static_cast<std::int64_t>(batch.global_count);
        sum.samples += static_cast<std::int64_t>(batch.global_count);
        ++window_steps;
        if (step % cfg.log_every == 0 || step == total_steps || sampler.epoch_done()) {
          double agg[1] = {window_loss};  // each rank's loss share sums to the global mean loss
          backend->allreduce_sync(comm::Buffer::of(std::span<double>(agg)), comm::ReduceOp::kSum, op);
          const double mean_loss = agg[0] / static_cast<double>(window_steps);
          sum.final_train_loss = mean_loss;
          const double sps = static_cast<double>(window_samples) / (window_step_ms / 1e3);
          metrics.write({{"step", step},
                         {"epoch", epoch},
                         {"world_size", world},
                         {"loss", mean_loss},
                         {"lr", lr},
                         {"samples_per_s", std::round(sps)},
                         {"step_ms", window_step_ms / static_cast<double>(window_steps)},
                         {"comm_ms", window_comm_ms / static_cast<double>(window_steps)},
                         {"exposed_comm_ms", bucketer->last_exposed_ms()}});
          if (rank == 0 && cfg.progress && (seconds_since(last_progress) > 2.0 || step == total_steps)) {
            last_progress = Clock::now();
            const double eta =
                (total_step_ms / static_cast<double>(step)) * static_cast<double>(total_steps - step) / 1e3;
            spdlog::info("epoch {}/{} step {}/{} loss {:.4f} lr {:.4g} {:.0f} samples/s ETA {:.0f}s",
                         epoch + 1, cfg.epochs, step, total_steps, mean_loss, lr, sps, eta);
          }
          window_loss = window_step_ms = window_comm_ms = 0;
          window_steps = window_samples = 0;
        }
      }
      const auto [test_loss, test_acc] = evaluate();
      sum.test_accuracy = test_acc;
      sum.test_loss = test_loss;
      sum.epochs = epoch + 1;
      metrics.write({{"event", "eval"},
                     {"epoch", epoch},
                     {"step", step},
                     {"world_size", world},
                     {"test_accuracy", test_acc},
                     {"test_loss", test_loss}});
      if (rank == 0) {
        spdlog::info("epoch {} done: test accuracy {:.2f}% (loss {:.4f})", epoch + 1, 100 * test_acc,
                     test_loss);
      }
    }
    sum.steps = step;
    sum.wall_s = seconds_since(t0);
    sum.mean_step_ms = step > 0 ? total_step_ms / static_cast<double>(step) : 0;
    sum.mean_comm_ms = step > 0 ? total_comm_ms / static_cast<double>(step) : 0;
    sum.samples_per_s = static_cast<double>(sum.samples) / (total_step_ms / 1e3);
    metrics.write({{"event", "done"},
                   {"test_accuracy", sum.test_accuracy},
                   {"test_loss", sum.test_loss},
                   {"train_loss", sum.final_train_loss},
                   {"steps", sum.steps},
                   {"epochs", sum.epochs},
                   {"samples", sum.samples},
                   {"world_size", world},
                   {"wall_s", sum.wall_s},
                   {"step_ms", sum.mean_step_ms},
                   {"comm_ms", sum.mean_comm_ms},
                   {"samples_per_s", std::round(sum.samples_per_s)}});
    return sum;
  }
};

Trainer::Trainer(Config config, const mpi::Communicator& comm)
    : impl_(std::make_unique<Impl>(std::move(config), comm)) {}
Trainer::~Trainer() = default;
Summary Trainer::run() { return impl_->run(); }
const model::Model& Trainer::model() const { return impl_->net; }

}  // namespace sinew::train
