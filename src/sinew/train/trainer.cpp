#include "sinew/train/trainer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>

#include "sinew/checkpoint/checkpoint.hpp"
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
/// Steps between the checks for a stop signal and for a finished background checkpoint.
constexpr std::int64_t kControlEvery = 10;

/// Set by SIGUSR1/SIGTERM: checkpoint within kControlEvery steps, then stop (exit code 75).
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

/// Installs the stop handlers while a checkpointing trainer lives; restores the previous ones after.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    old_usr1_ = std::signal(SIGUSR1, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  ~StopSignals() {
    std::signal(SIGUSR1, old_usr1_);
    std::signal(SIGTERM, old_term_);
  }

 private:
  void (*old_usr1_)(int) = SIG_DFL;
  void (*old_term_)(int) = SIG_DFL;
};

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
  std::int64_t start_step = 0;  // > 0 after a resume
  bool resumed = false;
  std::unique_ptr<checkpoint::Writer> writer;
  std::unique_ptr<StopSignals> signals;
  std::string pending_reason = "periodic";  // why the asynchronous checkpoint in flight was taken
  struct Fault {
    int rank = -1;
    checkpoint::WritePhase phase = checkpoint::WritePhase::kNone;
    std::int64_t step = -1;
  } fault;

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
    if (!cfg.checkpoint_dir.empty()) {
      checkpoint::WriterOptions wo;
      wo.keep = cfg.checkpoint_keep;
      wo.op = op;
      writer = std::make_unique<checkpoint::Writer>(cfg.checkpoint_dir, *backend, wo);
      if (!cfg.inject_checkpoint_fault.empty()) fault = parse_fault(cfg.inject_checkpoint_fault);
      signals = std::make_unique<StopSignals>();
    }
    resume();
    // Steps still to run: the rest of this epoch, then whole epochs, at this world size.
    const std::int64_t rest = static_cast<std::int64_t>(sampler.steps_left(backend->size(), cfg.batch_size)) +
                              steps_per_epoch * std::max<std::int64_t>(0, cfg.epochs - 1 - sampler.epoch());
    total_steps = start_step + rest;
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

  /// The whole training state; the same on every rank (parameters and optimiser state are replicated).
  checkpoint::TrainingState snapshot(std::int64_t step) const {
    checkpoint::TrainingState st;
    st.tensors["params"].assign(net.params().begin(), net.params().end());
    for (const auto& [name, buf] : optimizer->state())
      st.tensors["optim/" + name].assign(buf.begin(), buf.end());
    st.step = step;
    st.epoch = sampler.epoch();
    st.cursor = sampler.cursor();
    st.dataset_size = data.train.size();
    st.seed = cfg.seed;
    st.optimizer_steps = optimizer->steps();
    st.world_size = backend->size();
    st.config_json = to_json(cfg).dump();
    return st;
  }

  static Fault parse_fault(const std::string& spec) {
    Fault f;
    const auto a = spec.find(':'), b = spec.rfind(':');
    try {
      if (a == std::string::npos || a == b) throw std::invalid_argument(spec);
      f.rank = std::stoi(spec.substr(0, a));
      f.phase = checkpoint::parse_phase(spec.substr(a + 1, b - a - 1));
      f.step = std::stoll(spec.substr(b + 1));
    } catch (const std::logic_error&) {
      SINEW_THROW(InvalidArgument, "--inject-checkpoint-fault: '{}' is not RANK:PHASE:STEP", spec);
    }
    return f;
  }

  /// Collective. Throws CheckpointError (same on every rank) if it could not be written.
  /// Collective. Throws CheckpointError (same on every rank) if it could not be written. With
  /// --checkpoint-async only periodic checkpoints go to the background; a stop or the end is synchronous.
  void save(std::int64_t step, const char* why, bool async) {
    if (step == fault.step) writer->arm_fault(fault.phase, fault.rank);
    if (async) {
      if (writer->save_async(snapshot(step))) pending_reason = why;
      return;
    }
    if (auto r = writer->finish_async()) report(*r, pending_reason.c_str());
    report(writer->save(snapshot(step)), why);
  }

  void report(const checkpoint::SaveResult& r, const char* why) {
    if (r.skipped) return;
    metrics.write({{"event", "checkpoint"},
                   {"step", r.step},
                   {"path", r.path},
                   {"reason", why},
                   {"bytes", r.bytes},
                   {"write_ms", r.write_ms},
                   {"commit_ms", r.commit_ms},
                   {"world_size", backend->size()}});
    if (backend->rank() == 0) {
      spdlog::info("checkpoint committed: {} ({:.1f} MB, write {:.0f} ms, commit {:.0f} ms)", r.path,
                   static_cast<double>(r.bytes) / 1e6, r.write_ms, r.commit_ms);
    }
  }

  /// A failed checkpoint (e.g. a full disk) is reported and training goes on: the previous checkpoints
  /// stay valid. The run then ends with exit code 4 (see Summary::checkpoint_error).
  void checkpoint_or_report(std::int64_t step, const char* why, Summary& sum, bool async = false) {
    try {
      save(step, why, async);
    } catch (const CheckpointError& e) {
      failed_checkpoint(step, why, e, sum);
    }
  }

  /// Commits the asynchronous checkpoint in flight (collective; waits for the local write if needed).
  void finish_checkpoint(std::int64_t step, Summary& sum) {
    try {
      if (auto r = writer->finish_async()) report(*r, pending_reason.c_str());
    } catch (const CheckpointError& e) {
      failed_checkpoint(step, pending_reason.c_str(), e, sum);
    }
  }

  void failed_checkpoint(std::int64_t step, const char* why, const CheckpointError& e, Summary& sum) {
    sum.checkpoint_error = e.message();
    metrics.write({{"event", "checkpoint"}, {"step", step}, {"reason", why}, {"error", e.message()}});
    if (backend->rank() == 0)
      spdlog::error("checkpoint failed at step {}, training goes on: {}", step, e.message());
  }

  /// --resume auto|PATH: rank 0 picks the checkpoint (verifying it), every rank loads it and applies it.
  void resume() {
    if (cfg.resume == "never" || (cfg.resume == "auto" && cfg.checkpoint_dir.empty())) return;
    std::string path;
    nlohmann::json skipped = nlohmann::json::array();
    if (cfg.resume == "auto") {
      if (backend->rank() == 0) {
        auto latest = checkpoint::find_latest(cfg.checkpoint_dir);
        for (const auto& e : latest.skipped) {
          spdlog::warn("resume: skipping {}: {}", e.path, e.reason);
          skipped.push_back({{"path", e.path}, {"reason", e.reason}});
        }
        if (latest.found) path = latest.found->path;
      }
      std::vector<std::uint8_t> buf(4096, 0);  // the chosen path, NUL-terminated
      std::copy_n(path.begin(), std::min(path.size(), buf.size() - 1), buf.begin());
      backend->broadcast_sync(comm::Buffer::of(std::span<std::uint8_t>(buf)), 0, op);
      path.assign(reinterpret_cast<const char*>(buf.data()));
      if (path.empty()) {
        if (backend->rank() == 0)
          spdlog::info("resume: no valid checkpoint in {}, starting fresh", cfg.checkpoint_dir);
        return;
      }
    } else {
      path = cfg.resume;
    }
    // Every rank loads (and verifies) the whole state; a failure anywhere fails everywhere.
    std::int64_t ok = 1;
    std::string why;
    checkpoint::TrainingState st;
    try {
      st = checkpoint::load(path);
      apply(st, path);
    } catch (const CheckpointError& e) {
      ok = 0;
      why = e.message();
    }
    backend->allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(&ok, 1)), comm::ReduceOp::kMin, op);
    if (!ok) {
      SINEW_THROW(CheckpointError, "cannot resume: {}",
                  why.empty() ? fmt::format("{}: another rank could not load it", path) : why);
    }
    resumed = true;
    start_step = st.step;
    metrics.write({{"event", "resume"},
                   {"path", path},
                   {"step", st.step},
                   {"epoch", st.epoch},
                   {"cursor", st.cursor},
                   {"from_world_size", st.world_size},
                   {"world_size", backend->size()},
                   {"skipped", skipped}});
    if (backend->rank() == 0) {
      spdlog::info("resumed from {} (step {}, epoch {}, sample {}/{}, written by {} ranks)", path, st.step,
                   st.epoch + 1, st.cursor, st.dataset_size, st.world_size);
    }
  }

  /// Copies a loaded state into the model, optimiser and sampler, after checking that it fits this run.
  void apply(const checkpoint::TrainingState& st, const std::string& path) {
    auto tensor = [&](const std::string& name, std::size_t size) -> const std::vector<float>& {
      auto it = st.tensors.find(name);
      if (it == st.tensors.end()) {
        SINEW_THROW(CheckpointError, "{} has no tensor '{}': was it written with another --optimizer?", path,
                    name);
      }
      if (it->second.size() != size) {
        SINEW_THROW(CheckpointError,
                    "{}: tensor '{}' has {} elements, this run needs {}: was it written with another "
                    "--model or --optimizer?",
                    path, name, it->second.size(), size);
      }
      return it->second;
    };
    if (st.dataset_size != data.train.size()) {
      SINEW_THROW(CheckpointError,
                  "{} was written for {} training samples, this run has {}: another --dataset or "
                  "--limit-train?",
                  path, st.dataset_size, data.train.size());
    }
    if (st.seed != cfg.seed) {
      SINEW_THROW(CheckpointError,
                  "{} was written with --seed {}, this run has --seed {}: the data order would "
                  "differ",
                  path, st.seed, cfg.seed);
    }
    const auto& p = tensor("params", net.num_params());
    std::copy(p.begin(), p.end(), net.params().begin());
    for (auto& [name, buf] : optimizer->state()) {
      const auto& v = tensor("optim/" + name, buf.size());
      std::copy(v.begin(), v.end(), buf.begin());
    }
    optimizer->set_steps(st.optimizer_steps);
    sampler.set_position(st.epoch, st.cursor);
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
    std::int64_t step = start_step;
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
    const int first_epoch = resumed ? static_cast<int>(sampler.epoch()) : 0;
    bool stop = false;
    for (int epoch = first_epoch; epoch < cfg.epochs && step < total_steps && !stop; ++epoch) {
      if (!(resumed && epoch == first_epoch)) sampler.start_epoch(epoch);
      while (!sampler.epoch_done() && step < total_steps && !stop) {
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
        const bool checkpoint_due = cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0;
        if (writer && (step % kControlEvery == 0 || checkpoint_due)) {
          const auto tc = Clock::now();
          // One small collective agrees on a stop signal (which may reach only some ranks) and on whether
          // every rank's background checkpoint write is done. Every kControlEvery steps, so a signal is
          // acted on within that many steps.
          std::int64_t control[2] = {g_stop_signal.load(),
                                     writer->async_in_flight() && !writer->async_done() ? 1 : 0};
          backend->allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(control)), comm::ReduceOp::kMax,
                                  op);
          if (control[0] != 0) {
            stop = true;
            sum.stopped_by_signal = static_cast<int>(control[0]);
            if (rank == 0) {
              spdlog::warn("signal {} received: checkpointing at step {} and stopping", control[0], step);
            }
          }
          if (writer->async_in_flight() && control[1] == 0) finish_checkpoint(step, sum);
          if (stop || checkpoint_due) {
            checkpoint_or_report(step, stop ? "signal" : "periodic", sum, cfg.checkpoint_async && !stop);
          }
          sum.checkpoint_ms += seconds_since(tc) * 1e3;
        }
      }
      if (stop) break;
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
    if (writer && !stop) checkpoint_or_report(step, "end", sum);
    if (writer && writer->async_in_flight()) finish_checkpoint(step, sum);  // e.g. after a stop
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
                   {"samples_per_s", std::round(sum.samples_per_s)},
                   {"stopped_by_signal", sum.stopped_by_signal},
                   {"checkpoint_error", sum.checkpoint_error}});
    return sum;
  }
};

Trainer::Trainer(Config config, const mpi::Communicator& comm)
    : impl_(std::make_unique<Impl>(std::move(config), comm)) {}
Trainer::~Trainer() = default;
Summary Trainer::run() { return impl_->run(); }
const model::Model& Trainer::model() const { return impl_->net; }

}  // namespace sinew::train
