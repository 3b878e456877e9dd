#include "sinew/train/trainer.hpp"

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <thread>

#include "sinew/checkpoint/writer.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/launch.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/distill/distiller.hpp"
#include "sinew/distill/sources.hpp"
#include "sinew/model/loss.hpp"
#include "sinew/model/model.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/train/audit.hpp"
#include "sinew/train/checkpoints.hpp"
#include "sinew/train/control.hpp"
#include "sinew/train/device.hpp"
#include "sinew/train/elastic.hpp"
#include "sinew/train/events.hpp"
#include "sinew/train/fabric.hpp"
#include "sinew/train/rescale.hpp"
#include "sinew/train/state.hpp"

namespace sinew::train {

using fault::Point;
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

algo::AlgorithmOptions algorithm_options(const Config& c) {
  algo::AlgorithmOptions o;
  o.name = c.algorithm;
  o.allreduce = c.allreduce;
  o.chunk = c.compress_chunk;
  o.error_feedback = c.error_feedback;
  o.qadam_warmup_steps = c.qadam_warmup_steps;
  o.bits = c.bytegrad_bits;
  o.powersgd_rank = c.powersgd_rank;
  o.powersgd_warmup_steps = c.powersgd_warmup_steps;
  o.peer_selection = c.peer_selection;
  o.comm_interval = c.comm_interval;
  o.sync_interval_ms = c.sync_interval_ms;
  return o;
}

optim::OptimizerOptions optimizer_options(const Config& c) {
  return {c.optimizer, c.momentum, c.weight_decay, c.nesterov};
}

double ms_since(Clock::time_point t) { return seconds_since(t) * 1e3; }

/// The job token of the teacher service: --distill-token-file, else $SINEW_JOB_TOKEN.
std::string job_token(const Config& c) {
  if (!c.distill_token_file.empty()) {
    std::ifstream in(c.distill_token_file);
    std::string token;
    if (!in || !std::getline(in, token) || token.empty()) {
      SINEW_THROW(InvalidArgument, "--distill-token-file {}: cannot read a token from it (one line)",
                  c.distill_token_file);
    }
    return token;
  }
  const char* env = std::getenv("SINEW_JOB_TOKEN");  // NOLINT(concurrency-mt-unsafe): nothing sets it
  if (env == nullptr || *env == '\0') {
    SINEW_THROW(
        InvalidArgument,
        "--distill-registry needs the job's token: give --distill-token-file FILE or set SINEW_JOB_TOKEN");
  }
  return env;
}

/// The teacher of --distill-*, or none.
std::unique_ptr<distill::Distiller> make_distiller(const Config& c, const data::Dataset& train,
                                                   const distill::ServiceFactory& service, int launch_rank,
                                                   std::function<std::pair<int, int>()> position) {
  if (!distilling(c)) return nullptr;
  std::unique_ptr<distill::LogitSource> source;
  if (!c.distill_table.empty()) {
    source = distill::logit_table(c.distill_table, train);
  } else if (!c.distill_teacher_checkpoint.empty()) {
    source = distill::local_teacher(c.distill_teacher_checkpoint, train);
  } else {
    if (!service) {
      SINEW_THROW(InvalidArgument, "--distill-registry: this program was built without the teacher service");
    }
    distill::ServiceSpec spec;
    spec.registry = c.distill_registry;
    spec.job = c.distill_job;
    spec.token = job_token(c);
    spec.dataset = data::fingerprint(train);
    spec.dataset_size = train.size();
    spec.classes = train.num_classes;
    // Unique in the job across relaunches and spawned replacements: host, process and launch rank.
    std::array<char, 256> host{};
    gethostname(host.data(), host.size() - 1);
    spec.student = fmt::format("{}-{}-r{}", host.data(), getpid(), launch_rank);
    spec.position = std::move(position);
    source = service(spec);
  }
  if (source->classes() != train.num_classes) {
    SINEW_THROW(InvalidArgument, "the teacher ({}) has {} classes, the data set {}", source->describe(),
                source->classes(), train.num_classes);
  }
  distill::DistillOptions o;
  o.alpha = c.distill_alpha;
  o.temperature = c.distill_temperature;
  o.timeout = std::chrono::milliseconds(c.distill_timeout_ms);
  // A rank that waits for logits holds the others in the next collective: its wait stays well inside
  // that collective's deadline.
  o.max_wait = std::chrono::milliseconds(
      std::min(c.distill_max_wait_ms, std::max(c.distill_timeout_ms, c.timeout_ms / 2)));
  o.on_missing = c.distill_on_missing == "wait" ? distill::OnMissing::kWait : distill::OnMissing::kLabels;
  o.fetch_threads = c.distill_threads;
  return std::make_unique<distill::Distiller>(o, std::move(source), train.size());
}

/// Running sums of the steps since the last metrics line (the window) and since the start (totals).
struct StepStats {
  double loss = 0, step_ms = 0, comm_ms = 0;
  std::int64_t steps = 0, samples = 0;
  std::uint64_t bytes_sent = 0;  // by this rank, for the algorithm
  double total_step_ms = 0, total_comm_ms = 0;
  std::int64_t total_steps = 0;
  double distill_wait_ms = 0;        // window: this rank's wait for teacher logits
  std::int64_t distill_missing = 0;  // window: this rank's samples trained on labels alone
  Clock::time_point last_progress = Clock::now();

  void reset_window() {
    loss = step_ms = comm_ms = distill_wait_ms = 0;
    steps = samples = distill_missing = 0;
    bytes_sent = 0;
  }
};

/// How the loop ended.
enum class After : std::uint8_t { kContinue, kStop, kLeft };

}  // namespace

struct Trainer::Impl {
  Config cfg;
  /// Restart generation (core/launch.hpp: Slurm's requeues and sinew-supervise's relaunches combined):
  /// orders the audit records of successive launches, makes a relaunch append to the metrics and disables
  /// fault injection.
  int generation = launch::current().restart_generation();
  membership::Group group;
  fault::Plan faults;
  data::DataSplit data;
  model::Model net;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<Device> device;  // --device cuda: opened by the first fabric (attach_device)
  data::DistributedSampler sampler;
  TrainState state;
  Events events;
  AuditLog audit;
  StepControl control;
  LrRescaler lr;
  FabricSetup setup;
  ElasticController elastic;
  CheckpointPolicy checkpoints;

  StepStats stats;
  /// A recovery is over when the first step after it completes: then its `recovered` event is written.
  struct PendingRecovery {
    Clock::time_point detected;
    RecoveredEvent event;
  };
  std::optional<PendingRecovery> pending;
  std::vector<float> accum;  // gradient accumulation (--global-batch)
  Matrix x_, dlogits_;
  std::vector<std::int32_t> labels_;

  // This rank's place in the group, for the teacher service's balancer (read from its threads).
  std::atomic<int> student_rank{0}, student_size{1};
  std::unique_ptr<distill::Distiller> distiller;  // --distill-*: the teacher's logits
  std::vector<float> teacher_;                    // this micro-batch's teacher logits
  std::vector<std::uint8_t> has_teacher_;

  Impl(Config c, membership::Group g, const distill::ServiceFactory& service)
      : cfg(std::move(c)),
        group(std::move(g)),
        faults(cfg.inject_fault, group.launch_rank(), generation),
        data(data::load_dataset(dataset_options(cfg))),
        net(model::Model::build(cfg.model, {data.train.channels, data.train.height, data.train.width},
                                data.train.num_classes, cfg.seed)),
        optimizer(optim::make_optimizer(optimizer_options(cfg), net.num_params())),
        sampler(data.train.size(), cfg.seed, /*shuffle=*/true),
        state(net, *optimizer, sampler, cfg.seed),
        // A relaunch (sinew-supervise's restart mode, a requeued Slurm job) appends to the first launch's
        // metrics.
        events(cfg.metrics, group.rank() == 0 && group.role() != membership::Role::kRecovered,
               generation > 0),
        audit(cfg.audit_dir.empty() ? AuditLog() : AuditLog(cfg.audit_dir)),
        control(parse_resize_schedule(cfg.resize_schedule), cfg.max_ranks, cfg.checkpoint_every),
        lr(cfg, data.train.size()),
        setup(fabric_setup()),
        elastic(cfg, group, setup, state, lr, control, events, faults),
        checkpoints(cfg, setup.op, state, events, generation) {
    // Before the group's first collective, so that a teacher that cannot be used fails the launch cleanly.
    student_rank = group.rank();
    student_size = group.size();
    distiller = make_distiller(cfg, data.train, service, group.launch_rank(), [this] {
      return std::pair{student_rank.load(), student_size.load()};
    });
    if (distiller && group.rank() == 0 && group.role() == membership::Role::kInitial)
      spdlog::info("distilling from {} (alpha {}, T {})", distiller->describe(), cfg.distill_alpha,
                   cfg.distill_temperature);
    if (group.spare()) {
      // A hot spare: the data and the model are loaded; it waits in run() until it is promoted.
    } else if (group.role() == membership::Role::kRecovered) {
      // Spawned to replace failed ranks: the parents are in grow_to() -> connect() -> synchronise().
      state.pos().step = -1;
      try {
        elastic.connect();
        elastic.synchronise();
        elastic.rescale(0, "grow");
      } catch (const CommFailure& e) {
        // A member died while this process was joining. It is in the view already (the merge is done),
        // so the survivors' recovery shrinks over it too: it must take part, or they would wait for it
        // for ever. recover() takes the state from the most advanced survivor (this process has none).
        elastic.recover(e);
      }
    } else {
      elastic.connect();
      // Same seed gives the same initial weights everywhere; the broadcast makes it a guarantee, as DDP does.
      fabric().backend().broadcast_sync(comm::Buffer::of(net.params()), 0, setup.op);
      if (device) device->to_device();
      checkpoints.resume(fabric());
      lr.start(state.pos(), group.size());
      if (!fabric().algorithm().lockstep()) state.mark_agreed();
    }
    lr.build_schedule(state.pos());
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;
  ~Impl() = default;

  Fabric& fabric() { return elastic.fabric(); }
  [[nodiscard]] std::int64_t step() const { return state.pos().step; }

  FabricSetup fabric_setup() {
    FabricSetup s;
    s.op.timeout = std::chrono::milliseconds(cfg.timeout_ms);
    s.checkpoint_dir = cfg.checkpoint_dir;
    s.checkpoint_keep = cfg.checkpoint_keep;
    s.faults = &faults;
    s.algorithm = algorithm_options(cfg);
    s.bucket_mb = cfg.bucket_mb;
    s.overlap = cfg.overlap;
    s.params = net.params();
    s.grads = net.grads();
    for (const auto& r : net.grad_ready_order()) s.grad_ready_order.push_back({r.offset, r.count});
    for (const auto& v : net.param_views()) {
      // C order: the first dimension is the rows, the others flattened are the columns.
      std::size_t cols = 1;
      for (std::size_t d = 1; d < v.shape.size(); ++d) cols *= v.shape[d];
      s.tensors.push_back({v.offset, v.shape.empty() ? 1 : v.shape[0], cols});
    }
    s.optimizer = optimizer.get();
    s.compute_ms = [this] { return probe_compute_ms(); };
    s.algorithm_event = [this](const nlohmann::json& ev) {
      events.emit(AlgorithmEvent{ev, step()});
      if (group.rank() == 0)
        spdlog::info("algorithm: {} ({})", ev.value("chosen", ""), ev.value("reason", ""));
    };
    if (cfg.device == "cuda") s.attach_device = [this](comm::Backend& view) { return attach_device(view); };
    return s;
  }

  /// --device cuda, in every fabric's construction (collective): a member keeps its GPU; the first
  /// fabric of a member (at launch, or a spawned replacement's) picks a free one and copies the model
  /// there.
  float* attach_device(comm::Backend& view) {
    const int d = choose_device(view, setup.op, device ? device->index() : -1);
    if (!device) {
      device = Device::open(net, *optimizer, optimizer_options(cfg), d);
      state.set_device(device.get());
      if (view.rank() == 0) spdlog::info("training on one GPU per rank; rank 0 on {}", device->describe());
    }
    return device->grads();
  }

  /// One step's forward and backward on this rank's batch, without communication (median of 3, ms): what
  /// `--algorithm auto` weighs communication against. Leaves the parameters untouched.
  double probe_compute_ms() {
    std::vector<std::size_t> idx(std::min(cfg.batch_size, data.train.size()));
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    x_.resize(data.train.dim(), static_cast<Eigen::Index>(idx.size()));
    labels_.resize(idx.size());
    data.train.gather(idx, x_.data(), labels_.data());
    std::vector<double> ms;
    for (int i = 0; i < 3; ++i) {
      const auto t = Clock::now();
      const Matrix& logits = net.forward(x_);
      model::softmax_cross_entropy(logits, labels_, dlogits_, static_cast<double>(idx.size()));
      net.backward(dlogits_);
      ms.push_back(ms_since(t));
    }
    std::sort(ms.begin(), ms.end());
    return ms[1];
  }

  // ---- evaluation ------------------------------------------------------------------------------------

  /// Test-set loss and accuracy; every rank evaluates a contiguous shard, the sums are reduced.
  std::pair<double, double> evaluate() {
    auto& f = fabric();
    f.algorithm().consensus();  // evaluate the group's one model
    const auto& test = data.test;
    const std::size_t n = test.size();
    const auto r = static_cast<std::size_t>(f.rank());
    const auto w = static_cast<std::size_t>(f.size());
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
      if (device) {
        const auto [loss_sum, correct] = device->evaluate(x.data(), labels.data(), m);
        sums[0] += loss_sum;
        sums[1] += static_cast<double>(correct);
        continue;
      }
      const Matrix& logits = net.forward(x);
      sums[0] += model::softmax_cross_entropy(logits, labels, dlogits, 1.0);
      sums[1] += static_cast<double>(model::count_correct(logits, labels));
    }
    f.backend().allreduce_sync(comm::Buffer::of(std::span<double>(sums)), comm::ReduceOp::kSum, setup.op);
    return {sums[0] / std::max(sums[2], 1.0), sums[1] / std::max(sums[2], 1.0)};
  }

  /// Evaluates on the test set and reports it (summary, metrics, log line).
  void evaluate_and_report(Summary& sum) {
    const auto [test_loss, test_acc] = evaluate();
    sum.test_accuracy = test_acc;
    sum.test_loss = test_loss;
    sum.epochs = static_cast<int>(sampler.epoch()) + 1;
    events.emit(EvalEvent{sampler.epoch(), step(), fabric().size(), test_acc, test_loss});
    if (fabric().rank() == 0 && sampler.epoch_done()) {
      spdlog::info("epoch {} done: test accuracy {:.2f}% (loss {:.4f})", sampler.epoch() + 1, 100 * test_acc,
                   test_loss);
    }
  }

  // ---- one step --------------------------------------------------------------------------------------

  /// Steps left at the current size: the rest of this epoch, then whole epochs (for progress and ETA).
  [[nodiscard]] std::int64_t steps_remaining() {
    const auto g = static_cast<double>(lr.step_batch(fabric().size()));
    const auto n = static_cast<double>(data.train.size());
    const double rest = std::ceil(static_cast<double>(data.train.size() - sampler.cursor()) / g);
    std::int64_t left =
        static_cast<std::int64_t>(rest) + static_cast<std::int64_t>(std::ceil(n / g)) *
                                              std::max<std::int64_t>(0, cfg.epochs - 1 - sampler.epoch());
    if (cfg.max_steps > 0) left = std::min(left, cfg.max_steps - step());
    return left;
  }

  /// Asks for the teacher logits of this rank's samples in the next --distill-prefetch steps (the sampler's
  /// order is known; a resize makes some of them someone else's, which costs a request, nothing more).
  void prefetch_teacher(int rank, int world, std::size_t step_total, std::size_t micro) {
    if (!distiller || cfg.distill_prefetch == 0) return;
    const std::size_t remaining = data.train.size() - sampler.cursor();
    for (int d = 0; d <= cfg.distill_prefetch; ++d) {  // d = 0: this step, first in the queue
      const std::size_t off = static_cast<std::size_t>(d) * step_total;
      if (off >= remaining) break;
      const std::size_t g = std::min(step_total, remaining - off);
      for (std::size_t j = 0; j < g; j += micro)
        distiller->prefetch(sampler.peek_range(rank, world, off + j, std::min(micro, g - j)).indices);
    }
  }

  /// The loss of a micro-batch on the CPU: with a teacher, distillation (samples without teacher logits on
  /// their labels alone, logged); without, cross-entropy. Fills dlogits_.
  float batch_loss(const Matrix& logits, std::span<const std::size_t> indices, double denominator,
                   std::int64_t step) {
    if (!distiller) return model::softmax_cross_entropy(logits, labels_, dlogits_, denominator);
    const auto got = distiller->take(indices, teacher_, has_teacher_);
    stats.distill_wait_ms += got.wait_ms;
    stats.distill_missing += static_cast<std::int64_t>(got.missing);
    if (got.missing > 0) {
      spdlog::warn(
          "step {}: {} of {} samples trained on their labels alone (no teacher logits after {:.0f} ms: {})",
          step, got.missing, got.samples, got.wait_ms, got.reason);
    }
    return model::distillation_loss(logits, labels_, teacher_, has_teacher_, cfg.distill_alpha,
                                    cfg.distill_temperature, dlogits_, denominator);
  }

  /// One optimiser step: the step's samples (several micro-batches with --global-batch), forward,
  /// backward with buckets reduced as they fill, the fused optimiser step; then the position advances.
  void train_step(Summary& sum) {
    auto& f = fabric();
    const int rank = f.rank(), world = f.size();
    const std::int64_t next = step() + 1;  // the step being trained
    const auto ts = Clock::now();
    const std::size_t micro = static_cast<std::size_t>(world) * cfg.batch_size;
    const std::size_t total = std::min(lr.step_batch(world), data.train.size() - sampler.cursor());
    const std::size_t k = (total + micro - 1) / micro;
    const float rate = lr.lr(state.position());
    if (k > 1) accum.assign(net.num_params(), 0.f);
    student_rank = rank;
    student_size = world;
    prefetch_teacher(rank, world, total, micro);
    float local_loss = 0;
    bool first_ready = true;
    f.algorithm().begin_step(next);
    const bool reduce = f.algorithm().reduces_gradients(next);
    auto ready = [&](model::ParamRange r) {
      if (k > 1) {
        auto g = net.grads().subspan(r.offset, r.count);
        const float* a = accum.data() + r.offset;
        for (std::size_t i = 0; i < r.count; ++i) g[i] += a[i];
      }
      if (!reduce) return;
      f.mark_ready({r.offset, r.count});
      if (first_ready) {
        first_ready = false;
        faults.at(Point::kAllreduce, next);  // the peers are now inside the gradient allreduce
      }
    };
    // On the GPU a range is final when its event is.
    auto ready_on_device = [&](model::ParamRange r, Device::Event e) {
      if (!reduce) return;
      f.mark_ready({r.offset, r.count}, e);
      if (first_ready) {
        first_ready = false;
        faults.at(Point::kAllreduce, next);
      }
    };
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t offset = j * micro;
      const auto batch = sampler.peek_range(rank, world, offset, std::min(micro, total - offset));
      audit.record(generation, group.epoch(), next, sampler.epoch(), batch.indices);
      const bool last = j + 1 == k;
      if (device) {
        // On the GPU the micro-batches accumulate in device memory, and an empty one (the epoch's last
        // step can leave a rank without samples) leaves zeros or adds nothing.
        const std::size_t n = batch.indices.size();
        if (n > 0) {
          if (j == 0) faults.at(Point::kForward, next);
          x_.resize(data.train.dim(), static_cast<Eigen::Index>(n));
          labels_.resize(n);
          data.train.gather(batch.indices, x_.data(), labels_.data());
          if (j == 0) faults.at(Point::kBackward, next);
        }
        local_loss += device->train_batch(x_.data(), labels_.data(), n, static_cast<double>(total),
                                          /*accumulate=*/j > 0,
                                          last ? Device::ReadyFn(ready_on_device) : Device::ReadyFn());
        continue;
      }
      if (!batch.indices.empty()) {
        if (j == 0) faults.at(Point::kForward, next);
        const auto n = static_cast<Eigen::Index>(batch.indices.size());
        x_.resize(data.train.dim(), n);
        labels_.resize(batch.indices.size());
        data.train.gather(batch.indices, x_.data(), labels_.data());
        const Matrix& logits = net.forward(x_);
        // Dividing by the step's global count makes the summed gradients the exact global mean.
        local_loss += batch_loss(logits, batch.indices, static_cast<double>(total), next);
        if (j == 0) faults.at(Point::kBackward, next);
        if (last) {
          net.backward(dlogits_, ready);
        } else {
          net.backward(dlogits_);
        }
      } else {
        // The epoch's last step can leave a rank without samples: it contributes zero gradients.
        std::fill(net.grads().begin(), net.grads().end(), 0.f);
        if (last)
          for (const auto& r : net.grad_ready_order()) ready(r);
      }
      if (!last) {
        const auto g = net.grads();
        for (std::size_t i = 0; i < g.size(); ++i) accum[i] += g[i];
      }
    }
    double comm_ms = 0;
    if (reduce) {
      f.finish_reduction();
      comm_ms = f.last_comm_ms();
    }
    // Without a gradient reduction the algorithm communicates in its step (qadam) or after it: the peers
    // are about to enter that exchange.
    if (!reduce) faults.at(Point::kAllreduce, next);
    faults.at(Point::kOptimizer, next);
    if (device) {
      device->optimizer_step(rate);
    } else {
      f.algorithm().step(next, rate);
    }
    const auto ta = Clock::now();
    f.algorithm().after_step(next);
    if (!reduce) comm_ms += ms_since(ta);
    sampler.advance(total);
    state.pos().step = next;
    const double step_ms = ms_since(ts);
    if (distiller) distiller->step_done(step_ms);
    const auto sent = f.take_bytes_sent();
    stats.bytes_sent += sent;
    sum.bytes_sent += sent;
    stats.step_ms += step_ms;
    stats.comm_ms += comm_ms;
    stats.total_step_ms += step_ms;
    stats.total_comm_ms += comm_ms;
    ++stats.total_steps;
    stats.loss += local_loss;
    stats.samples += static_cast<std::int64_t>(total);
    sum.samples += static_cast<std::int64_t>(total);
    ++stats.steps;
    if (pending) {  // the first step after a recovery completed: the recovery is over
      pending->event.first_step_ms = step_ms;
      pending->event.total_ms = ms_since(pending->detected);
      pending->event.step = next;
      events.emit(pending->event);
      if (rank == 0)
        spdlog::info("recovered: first step done {:.1f} ms after the failure was detected",
                     pending->event.total_ms);
      pending.reset();
    }
    const bool epoch_end = sampler.epoch_done();
    if (next % cfg.log_every == 0 || epoch_end || (cfg.max_steps > 0 && next >= cfg.max_steps))
      log_window(sum, rate);
  }

  /// A metrics line (and the progress line) with the window's means; the loss is reduced over the group.
  void log_window(Summary& sum, float rate) {
    auto& f = fabric();
    // Each rank's loss share sums to the global mean loss; the distillation figures sum over the ranks.
    double agg[3] = {stats.loss, stats.distill_wait_ms, static_cast<double>(stats.distill_missing)};
    f.backend().allreduce_sync(comm::Buffer::of(std::span<double>(agg)), comm::ReduceOp::kSum, setup.op);
    const auto steps = static_cast<double>(stats.steps);
    const double mean_loss = agg[0] / steps;
    sum.final_train_loss = mean_loss;
    const double sps = static_cast<double>(stats.samples) / (stats.step_ms / 1e3);
    StepEvent e;
    e.step = step();
    e.epoch = sampler.epoch();
    e.world_size = f.size();
    e.loss = mean_loss;
    e.lr = rate;
    e.samples_per_s = std::round(sps);
    e.step_ms = stats.step_ms / steps;
    e.comm_ms = stats.comm_ms / steps;
    e.exposed_comm_ms = f.last_exposed_ms();
    e.bytes_sent_per_step = static_cast<double>(stats.bytes_sent) / steps;
    if (distiller) {
      e.distilling = true;
      e.distill_wait_ms = agg[1] / steps / static_cast<double>(f.size());
      e.distill_missing = static_cast<std::int64_t>(agg[2]);
    }
    events.emit(e);
    if (f.rank() == 0 && cfg.progress && seconds_since(stats.last_progress) > 2.0) {
      stats.last_progress = Clock::now();
      const std::int64_t left = steps_remaining();
      const double eta =
          (stats.total_step_ms / static_cast<double>(stats.total_steps)) * static_cast<double>(left) / 1e3;
      spdlog::info("epoch {}/{} step {}/{} loss {:.4f} lr {:.4g} {} ranks {:.0f} samples/s ETA {:.0f}s",
                   sampler.epoch() + 1, cfg.epochs, step(), step() + left, mean_loss, rate, f.size(), sps,
                   eta);
    }
    stats.reset_window();
  }

  // ---- step boundaries: signals, leave requests, job-server resizes, checkpoints ----------------------

  After at_boundary(Summary& sum) {
    auto& f = fabric();
    const auto tc = Clock::now();
    auto* writer = f.writer();
    const Decision d =
        control.agree(state.pos(), f.backend(), setup.op, writer != nullptr, CheckpointPolicy::in_flight(f),
                      writer != nullptr && writer->async_ready());
    if (!d.agreed) return After::kContinue;
    // Every member completed this step (the agreement was a collective over all of them).
    if (!f.algorithm().lockstep()) state.mark_agreed();
    After next = After::kContinue;
    if (d.stop_signal != 0) {
      next = After::kStop;
      sum.stopped_by_signal = d.stop_signal;
      if (f.rank() == 0)
        spdlog::warn("signal {} received: checkpointing at step {} and stopping", d.stop_signal, step());
    }
    if (CheckpointPolicy::in_flight(f) && (!d.async_pending || d.asked > 0 || d.resize_due))
      checkpoints.progress(f, /*wait=*/d.asked > 0 || d.resize_due);
    if (next == After::kStop || d.checkpoint_due) {
      checkpoints.save(f, next == After::kStop ? "signal" : "periodic",
                       cfg.checkpoint_async && next != After::kStop && d.asked == 0 && !d.resize_due);
    }
    sum.checkpoint_ms += ms_since(tc);
    if (next == After::kStop) return next;
    const int world = f.size();
    if (d.asked > 0 && d.asked < world) {
      state.pos().target_override = world - d.asked;
      if (elastic.leave(d.leaving, "requested")) return After::kLeft;
    }
    const int size = fabric().size();  // the fabric changed if members left
    const int target = control.target_size(state.pos());
    if (target < size) {
      std::vector<bool> extra(static_cast<std::size_t>(size), false);
      for (int r = target; r < size; ++r) extra[static_cast<std::size_t>(r)] = true;
      if (elastic.leave(extra, "job server")) return After::kLeft;
    } else if (target > size && control.has_schedule()) {
      elastic.grow_to(target, "job server");
    }
    return After::kContinue;
  }

  // ---- the loop --------------------------------------------------------------------------------------

  /// Trains until the end (or a stop); resumable: after a recovery it continues from the synchronised
  /// position. Throws CommFailure on a failure.
  After train_loop(Summary& sum) {
    for (;;) {
      if (sampler.epoch_done()) {
        if (state.pos().last_eval_epoch < sampler.epoch()) {
          evaluate_and_report(sum);
          state.pos().last_eval_epoch = sampler.epoch();
        }
        if (sampler.epoch() + 1 >= cfg.epochs || (cfg.max_steps > 0 && step() >= cfg.max_steps)) break;
        sampler.start_epoch(sampler.epoch() + 1);
        continue;
      }
      if (cfg.max_steps > 0 && step() >= cfg.max_steps) {
        evaluate_and_report(sum);  // stopped inside an epoch: evaluate what was trained
        break;
      }
      train_step(sum);
      if (cfg.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cfg.step_sleep_ms));
      const After a = at_boundary(sum);
      if (a != After::kContinue) return a;
    }
    checkpoints.save(fabric(), "end");
    return After::kContinue;
  }

  void announce_start() {
    auto& f = fabric();
    if (f.rank() != 0 || group.role() != membership::Role::kInitial) return;
    const std::int64_t total = step() + steps_remaining();
    spdlog::info(
        "training {} ({} parameters) on {} ({} train / {} test samples), {} ranks x batch {}, {} steps",
        cfg.model, net.num_params(), cfg.dataset, data.train.size(), data.test.size(), f.size(),
        cfg.batch_size, total);
    StartEvent e;
    e.world_size = f.size();
    e.model = cfg.model;
    e.dataset = cfg.dataset;
    e.params = net.num_params();
    e.batch_size = cfg.batch_size;
    e.global_batch = lr.step_batch(f.size());
    e.steps = total;
    e.buckets = f.num_buckets();
    e.elastic = name_of(kElasticNames, cfg.elastic);
    e.spares = group.spares();
    e.mpi = mpi::library_version();
    e.ulfm = mpi::ulfm_enabled();
    events.emit(e);
  }

  Summary run() {
    Summary sum;
    if (group.spare()) {
      // Waits without a core until the members reform the pool. Dismissed at the end: it never trained,
      // and leaves like a member that left on request.
      const auto how = group.wait_as_spare();
      if (!how) {
        sum.left = true;
        return sum;
      }
      spdlog::info("hot spare (launch rank {}) promoted to rank {} of {}", group.launch_rank(), group.rank(),
                   group.size());
      elastic.join_promoted(*how);
      lr.build_schedule(state.pos());
    }
    const auto t0 = Clock::now();
    announce_start();
    const bool inplace = cfg.elastic == ElasticMode::kInplace && mpi::ulfm_enabled();
    After end = After::kContinue;
    for (;;) {
      try {
        end = train_loop(sum);
        if (end == After::kStop) checkpoints.progress(fabric());
        break;
      } catch (const CommFailure& e) {
        if (!inplace) {
          if (cfg.elastic == ElasticMode::kOff) throw;
          // Restart mode (asked for, or no usable ULFM): the supervisor relaunches from the checkpoint.
          SINEW_THROW(RelaunchRequest, "{}; exiting for a relaunch from the latest checkpoint (--elastic {})",
                      e.message(), name_of(kElasticNames, cfg.elastic));
        }
        ++sum.failures;
        const RecoveryReport rep = elastic.recover(e);
        stats.reset_window();  // its partial sums included the lost step
        pending = PendingRecovery{rep.detected, {rep.world_size, group.epoch(), 0, 0, 0}};
        if (rep.world_size < cfg.min_ranks) {
          sum.below_min_ranks = true;
          if (fabric().rank() == 0) {
            spdlog::error("only {} ranks left, below --min-ranks {}: checkpointing step {} and stopping",
                          rep.world_size, cfg.min_ranks, step());
          }
          checkpoints.save(fabric(), "min-ranks");
          break;
        }
      }
    }
    sum.checkpoint_error = checkpoints.error();
    if (end != After::kLeft) group.dismiss_spares();  // training is over: the idle spares leave
    if (end == After::kLeft) {
      sum.left = true;
      return sum;
    }
    sum.steps = step();
    sum.world_size = fabric().size();
    sum.wall_s = seconds_since(t0);
    const auto n = static_cast<double>(stats.total_steps);
    sum.mean_step_ms = stats.total_steps > 0 ? stats.total_step_ms / n : 0;
    sum.mean_comm_ms = stats.total_steps > 0 ? stats.total_comm_ms / n : 0;
    sum.samples_per_s = static_cast<double>(sum.samples) / (stats.total_step_ms / 1e3);
    DoneEvent e;
    e.test_accuracy = sum.test_accuracy;
    e.test_loss = sum.test_loss;
    e.train_loss = sum.final_train_loss;
    e.steps = sum.steps;
    e.epochs = sum.epochs;
    e.samples = sum.samples;
    e.world_size = sum.world_size;
    e.failures = sum.failures;
    e.wall_s = sum.wall_s;
    e.step_ms = sum.mean_step_ms;
    e.comm_ms = sum.mean_comm_ms;
    e.samples_per_s = std::round(sum.samples_per_s);
    e.train_s = stats.total_step_ms / 1e3;
    e.algorithm = fabric().algorithm().name();
    e.bytes_sent_per_step =
        sum.steps > 0 ? static_cast<double>(sum.bytes_sent) / static_cast<double>(sum.steps) : 0.0;
    e.stopped_by_signal = sum.stopped_by_signal;
    e.below_min_ranks = sum.below_min_ranks;
    e.checkpoint_error = sum.checkpoint_error;
    if (distiller) {
      const auto t = distiller->totals();
      e.teacher = distiller->describe();
      e.distill_wait_ms_per_step = t.steps > 0 ? t.wait_ms / static_cast<double>(t.steps) : 0.0;
      e.distill_missing = t.missing;
      e.distill_failed_requests = t.failed_requests;
      e.distill_failovers = t.failovers;
      if (fabric().rank() == 0) {
        spdlog::info(
            "distillation: {:.2f} ms per step waiting for teacher logits, {} samples on labels alone, {} "
            "requests failed over to another teacher, {} failed (rank 0)",
            e.distill_wait_ms_per_step, t.missing, t.failovers, t.failed_requests);
      }
    }
    events.emit(e);
    return sum;
  }
};

Trainer::Trainer(Config config, const mpi::Communicator& comm, const distill::ServiceFactory& service)
    : impl_(std::make_unique<Impl>(std::move(config), membership::Group::over(comm), service)) {}
Trainer::Trainer(Config config, membership::Group group, const distill::ServiceFactory& service)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(group), service)) {}
Trainer::~Trainer() = default;
Summary Trainer::run() { return impl_->run(); }
const model::Model& Trainer::model() const { return impl_->net; }
int Trainer::rank() const { return impl_->group.rank(); }

}  // namespace sinew::train
