#include "sinew/train/trainer.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "sinew/algo/algorithm.hpp"
#include "sinew/checkpoint/checkpoint.hpp"
#include "sinew/comm/bucketer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
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
/// Steps between the agreements on stop signals, leave requests and finished background checkpoints.
constexpr std::int64_t kControlEvery = 10;

/// Set by SIGUSR1/SIGTERM: checkpoint within kControlEvery steps, then stop (exit code 75).
std::atomic<int> g_stop_signal{0};
/// Set by SIGUSR2: this rank leaves the group at the next control point (not a failure).
std::atomic<int> g_leave_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }
extern "C" void on_leave_signal(int sig) { g_leave_signal.store(sig); }

/// Installs the stop and leave handlers while a trainer runs; restores the previous ones after.
class Signals {
 public:
  Signals() {
    g_stop_signal.store(0);
    g_leave_signal.store(0);
    old_usr1_ = std::signal(SIGUSR1, on_stop_signal);
    old_term_ = std::signal(SIGTERM, on_stop_signal);
    old_usr2_ = std::signal(SIGUSR2, on_leave_signal);
  }
  Signals(const Signals&) = delete;
  Signals& operator=(const Signals&) = delete;
  ~Signals() {
    std::signal(SIGUSR1, old_usr1_);
    std::signal(SIGTERM, old_term_);
    std::signal(SIGUSR2, old_usr2_);
  }

 private:
  void (*old_usr1_)(int) = SIG_DFL;
  void (*old_term_)(int) = SIG_DFL;
  void (*old_usr2_)(int) = SIG_DFL;
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

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double ms_since(Clock::time_point t) { return seconds_since(t) * 1e3; }

/// Restart generation (set by mpi_scripts/sinew-supervise for each relaunch): orders the audit records
/// of successive launches.
int restart_generation() {
  const char* v = std::getenv("SINEW_RESTART_GENERATION");  // NOLINT(concurrency-mt-unsafe): at start-up
  return v != nullptr ? std::atoi(v) : 0;
}

/// Appends one line per micro-batch to DIR/audit-<host>-<pid>.txt: "GEN EPOCH STEP DATA_EPOCH i1 i2 ...".
/// Unbuffered (one write per line), so a killed rank's records up to its death are on disk.
class AuditLog {
 public:
  AuditLog() = default;
  explicit AuditLog(const std::string& dir) {
    std::filesystem::create_directories(dir);
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::string path = fmt::format("{}/audit-{}-{}.txt", dir, host, ::getpid());
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0)
      SINEW_THROW(InvalidArgument, "--audit-dir: cannot create {}: {}", path,
                  std::generic_category().message(errno));
  }
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;
  AuditLog(AuditLog&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  AuditLog& operator=(AuditLog&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~AuditLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  void record(int gen, std::uint64_t membership_epoch, std::int64_t step, std::int64_t data_epoch,
              const std::vector<std::size_t>& indices) {
    if (fd_ < 0) return;
    line_ = fmt::format("{} {} {} {}", gen, membership_epoch, step, data_epoch);
    for (auto i : indices) fmt::format_to(std::back_inserter(line_), " {}", i);
    line_ += '\n';
    if (::write(fd_, line_.data(), line_.size()) != static_cast<ssize_t>(line_.size())) {
      SINEW_THROW(DataError, "--audit-dir: write failed: {}", std::generic_category().message(errno));
    }
  }

 private:
  int fd_ = -1;
  std::string line_;
};

/// Bounds a blocking MPI call that ULFM cannot interrupt (MPI_Comm_spawn and the merge with the new
/// processes block forever if a member dies meanwhile, in Open MPI 5.0.7): past the deadline the job is
/// aborted with exit code 75, so that a supervisor (mpi_scripts/sinew-supervise) relaunches it from the
/// latest checkpoint instead of it hanging.
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds deadline, std::string what) : what_(std::move(what)) {
    thread_ = std::thread([this, deadline] {
      std::unique_lock lock(mu_);
      if (cv_.wait_for(lock, deadline, [this] { return done_; })) return;
      spdlog::critical("{} did not complete within {} ms; aborting the job for a relaunch (exit code 75)",
                       what_, deadline.count());
      MPI_Abort(MPI_COMM_WORLD, static_cast<int>(ExitCode::kRelaunch));
    });
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

struct Trainer::Impl {
  Config cfg;
  membership::Group group;
  data::DataSplit data;
  model::Model net;
  std::unique_ptr<optim::Optimizer> optimizer;
  data::DistributedSampler sampler;
  MetricsWriter metrics;
  comm::Options op;
  std::vector<Fault> faults;
  std::vector<std::pair<std::int64_t, int>> schedule_points;  // job-server schedule
  AuditLog audit;
  Signals signals;
  int generation = restart_generation();

  // Rebuilt on every change of membership (connect()).
  std::unique_ptr<comm::mpi::MpiBackend> backend;
  std::unique_ptr<algo::Algorithm> algorithm;
  std::unique_ptr<comm::GradientBucketer> bucketer;
  std::unique_ptr<checkpoint::Writer> writer;

  // The training position. Replicated; re-synchronised from the most advanced survivor after a failure.
  std::int64_t step = 0;
  std::int64_t last_eval_epoch = -1;
  int launch_world = 0;                   // size of the group at launch (or at resume): the lr reference
  std::int64_t sched_total = 0;           // length of the lr schedule, in steps of the reference global batch
  double base_batch = 0;                  // the reference global batch
  double factor_from = 1, factor_to = 1;  // lr rescaling ramp
  std::int64_t ramp_start = 0, ramp_steps = 0;
  int target_override = 0;  // > 0 after ranks left on request: do not grow back past it

  std::unique_ptr<optim::LrSchedule> schedule;
  std::vector<float> accum;  // gradient accumulation (--global-batch)
  bool resumed = false;
  std::string pending_reason = "periodic";  // why the asynchronous checkpoint in flight was taken
  checkpoint::WritePhase ckpt_fault_phase = checkpoint::WritePhase::kNone;
  std::int64_t ckpt_fault_step = -1;
  struct PendingRecovery {
    bool active = false;
    Clock::time_point detected;
    nlohmann::json event;
  } pending;

  Impl(Config c, membership::Group g)
      : cfg(std::move(c)),
        group(std::move(g)),
        data(data::load_dataset(dataset_options(cfg))),
        net(model::Model::build(cfg.model, {data.train.channels, data.train.height, data.train.width},
                                data.train.num_classes, cfg.seed)),
        sampler(data.train.size(), cfg.seed, /*shuffle=*/true) {
    op.timeout = std::chrono::milliseconds(cfg.timeout_ms);
    optimizer = optim::make_optimizer({cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.nesterov},
                                      net.num_params());
    for (const auto& f : cfg.inject_fault) faults.push_back(parse_fault(f));
    schedule_points = parse_resize_schedule(cfg.resize_schedule);
    if (!cfg.inject_checkpoint_fault.empty()) parse_checkpoint_fault(cfg.inject_checkpoint_fault);
    if (!cfg.audit_dir.empty()) audit = AuditLog(cfg.audit_dir);
    launch_world = group.size();
    if (group.role() == membership::Role::kRecovered) {
      // Spawned to replace failed ranks: the parents are in grow() -> connect() -> synchronise().
      step = -1;
      connect();
      synchronise();
      rescale(0, "grow");
    } else {
      // A relaunch by the supervisor (restart mode) appends to the first launch's metrics.
      if (group.rank() == 0 && !cfg.metrics.empty()) metrics = MetricsWriter(cfg.metrics, generation > 0);
      connect();
      // Same seed gives the same initial weights everywhere; the broadcast makes it a guarantee, as DDP does.
      backend->broadcast_sync(comm::Buffer::of(net.params()), 0, op);
      resume();
      base_batch =
          static_cast<double>(cfg.global_batch > 0 ? cfg.global_batch : launch_world * cfg.batch_size);
      const double epoch_steps = std::ceil(static_cast<double>(data.train.size()) / base_batch);
      sched_total = static_cast<std::int64_t>(epoch_steps) * cfg.epochs;
      if (cfg.max_steps > 0) sched_total = std::min(sched_total, cfg.max_steps);
    }
    optim::LrScheduleOptions so;
    so.base_lr = cfg.lr;
    so.warmup_steps = std::min(cfg.warmup_steps, sched_total / 2);
    so.kind = cfg.lr_schedule;
    so.step_size = cfg.lr_step_size;
    so.gamma = cfg.lr_gamma;
    so.total_steps = std::max<std::int64_t>(sched_total, 1);
    schedule = std::make_unique<optim::LrSchedule>(so);
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;
  ~Impl() { disconnect_clean(); }

  /// Builds the backend, the checkpoint writer and the gradient buckets over the current view.
  /// Collective (duplicates the view's communicator; the writer agrees on its directory).
  void connect() {
    bucketer.reset();
    algorithm.reset();
    writer.reset();
    backend = std::make_unique<comm::mpi::MpiBackend>(group.comm());
    if (!cfg.checkpoint_dir.empty()) {
      checkpoint::WriterOptions wo;
      wo.keep = cfg.checkpoint_keep;
      wo.op = op;
      writer = std::make_unique<checkpoint::Writer>(cfg.checkpoint_dir, *backend, wo);
    }
    log::set_rank(backend->rank(), backend->size());
    if (backend->rank() == 0 && !metrics.enabled() && !cfg.metrics.empty()) {
      metrics = MetricsWriter(cfg.metrics, /*append=*/true);  // rank 0 died: its successor takes over
    }
    algorithm = algo::make_algorithm(algorithm_options(), algorithm_context());
    std::vector<comm::Range> ranges;
    for (const auto& r : net.grad_ready_order()) ranges.push_back({r.offset, r.count});
    comm::BucketOptions bo;
    bo.bucket_bytes = static_cast<std::size_t>(cfg.bucket_mb * (1 << 20));
    bo.overlap = cfg.overlap;
    bo.op = op;
    if (!algorithm->uses_backend_allreduce()) {
      bo.reduce = [a = algorithm.get()](std::span<float> b, std::size_t offset) {
        a->reduce_bucket(b, offset);
      };
    }
    bucketer = std::make_unique<comm::GradientBucketer>(*backend, net.grads(), ranges, bo);
  }

  [[nodiscard]] algo::AlgorithmOptions algorithm_options() const {
    algo::AlgorithmOptions o;
    o.name = cfg.algorithm;
    o.allreduce = cfg.allreduce;
    o.chunk = cfg.compress_chunk;
    o.error_feedback = cfg.error_feedback;
    o.qadam_warmup_steps = cfg.qadam_warmup_steps;
    o.peer_selection = cfg.peer_selection;
    o.comm_interval = cfg.comm_interval;
    o.sync_interval_ms = cfg.sync_interval_ms;
    return o;
  }

  algo::Context algorithm_context() {
    algo::Context c{*backend, net.params(), net.grads(), *optimizer, op, {}, {}};
    c.compute_ms = [this] { return probe_compute_ms(); };
    c.event = [this](const nlohmann::json& ev) {
      nlohmann::json e = ev;
      e["step"] = step;
      metrics.write(e);
      if (backend->rank() == 0)
        spdlog::info("algorithm: {} ({})", ev.value("chosen", ""), ev.value("reason", ""));
    };
    return c;
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

  /// Drops everything built over the old view (after a failure, before a change).
  void disconnect() noexcept {
    if (backend) backend->abort();
    disconnect_clean();
  }

  // ---- fault injection -------------------------------------------------------------------------------

  void parse_checkpoint_fault(const std::string& spec) {
    const auto a = spec.find(':'), b = spec.rfind(':');
    try {
      if (a == std::string::npos || a == b) throw std::invalid_argument(spec);
      const int rank = std::stoi(spec.substr(0, a));
      ckpt_fault_phase = checkpoint::parse_phase(spec.substr(a + 1, b - a - 1));
      ckpt_fault_step = std::stoll(spec.substr(b + 1));
      if (rank != group.launch_rank()) ckpt_fault_phase = checkpoint::WritePhase::kNone;
    } catch (const std::logic_error&) {
      SINEW_THROW(InvalidArgument, "--inject-checkpoint-fault: '{}' is not RANK:PHASE:STEP", spec);
    }
  }

  /// Kills this process (SIGKILL, as a crash would) if --inject-fault names it, this phase and the step
  /// being trained (`step + 1`; for recovery and spawn: any step from then on).
  void inject(FaultPhase phase) const {
    if (generation > 0) return;  // a relaunch (restart mode) must not die the same way again
    for (const auto& f : faults) {
      if (f.rank != group.launch_rank() || f.phase != phase) continue;
      const bool later_ok = phase == FaultPhase::kRecovery || phase == FaultPhase::kSpawn;
      if (later_ok ? step + 1 < f.step : step + 1 != f.step) continue;
      fmt::print(stderr,
                 "[sinew] injected fault: killing launch rank {} at phase {} of step {} (unix_time {:.6f})\n",
                 f.rank, phase_name(phase), step + 1, unix_now_s());
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  }

  // ---- state -----------------------------------------------------------------------------------------

  /// The whole training state; the same on every rank (parameters and optimiser state are replicated).
  checkpoint::TrainingState snapshot() const {
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
    // Per-rank algorithm state (error-feedback residuals) as world_size blocks: rank r's shard of the
    // tensor is exactly its own block (docs/checkpoint-format.md).
    const auto r = static_cast<std::size_t>(backend->rank());
    for (const auto& [name, buf] : algorithm->rank_state()) {
      auto& t = st.tensors[name];
      t.assign(buf.size() * static_cast<std::size_t>(backend->size()), 0.f);
      std::copy(buf.begin(), buf.end(), t.begin() + static_cast<std::ptrdiff_t>(r * buf.size()));
    }
    return st;
  }

  /// Collective, after any change of membership: every member takes the training state of the most
  /// advanced one (the lowest rank among those at the highest step: a step that completed anywhere
  /// completed with every rank's gradients), from memory, then all check that they hold the same bytes.
  /// Returns milliseconds.
  double synchronise() {
    const auto t = Clock::now();
    std::int64_t top[1] = {step};
    backend->allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(top)), comm::ReduceOp::kMax, op);
    std::int64_t src[1] = {step == top[0] ? backend->rank() : std::numeric_limits<std::int64_t>::max()};
    backend->allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(src)), comm::ReduceOp::kMin, op);
    const int root = static_cast<int>(src[0]);
    double h[14] = {static_cast<double>(step),
                    static_cast<double>(sampler.epoch()),
                    static_cast<double>(sampler.cursor()),
                    static_cast<double>(optimizer->steps()),
                    static_cast<double>(last_eval_epoch),
                    static_cast<double>(launch_world),
                    static_cast<double>(sched_total),
                    base_batch,
                    factor_from,
                    factor_to,
                    static_cast<double>(ramp_start),
                    static_cast<double>(ramp_steps),
                    static_cast<double>(target_override),
                    resumed ? 1.0 : 0.0};
    backend->broadcast_sync(comm::Buffer::of(std::span<double>(h)), root, op);
    backend->broadcast_sync(comm::Buffer::of(net.params()), root, op);
    for (auto& [name, buf] : optimizer->state()) backend->broadcast_sync(comm::Buffer::of(buf), root, op);
    step = static_cast<std::int64_t>(h[0]);
    sampler.set_position(static_cast<std::int64_t>(h[1]), static_cast<std::size_t>(h[2]));
    optimizer->set_steps(static_cast<std::int64_t>(h[3]));
    last_eval_epoch = static_cast<std::int64_t>(h[4]);
    launch_world = static_cast<int>(h[5]);
    sched_total = static_cast<std::int64_t>(h[6]);
    base_batch = h[7];
    factor_from = h[8];
    factor_to = h[9];
    ramp_start = static_cast<std::int64_t>(h[10]);
    ramp_steps = static_cast<std::int64_t>(h[11]);
    target_override = static_cast<int>(h[12]);
    resumed = h[13] != 0;
    // Consistency: a checksum of everything that must be equal, compared as (max, -min).
    uLong crc = crc32(0L, Z_NULL, 0);
    auto add = [&crc](const void* p, std::size_t n) {
      crc = crc32(crc, static_cast<const Bytef*>(p), static_cast<uInt>(n));
    };
    add(h, sizeof h);
    add(net.params().data(), net.params().size_bytes());
    for (const auto& [name, buf] : optimizer->state()) add(buf.data(), buf.size_bytes());
    std::int64_t cmp[2] = {static_cast<std::int64_t>(crc), -static_cast<std::int64_t>(crc)};
    backend->allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(cmp)), comm::ReduceOp::kMax, op);
    if (cmp[0] != -cmp[1]) {
      SINEW_THROW(InternalError, "training state differs across ranks after synchronising from rank {}",
                  root);
    }
    algorithm->reset();
    return ms_since(t);
  }

  // ---- learning-rate rescaling -----------------------------------------------------------------------

  [[nodiscard]] std::size_t step_batch(int world) const {
    return cfg.global_batch > 0 ? cfg.global_batch : static_cast<std::size_t>(world) * cfg.batch_size;
  }

  [[nodiscard]] double lr_factor(std::int64_t s) const {
    if (ramp_steps <= 0 || s >= ramp_start + ramp_steps) return factor_to;
    const double a = static_cast<double>(s - ramp_start) / static_cast<double>(ramp_steps);
    return factor_from + (factor_to - factor_from) * std::max(0.0, a);
  }

  /// The lr schedule runs on samples consumed (in steps of the reference global batch), so that a resize
  /// neither stretches nor cuts it; the rescaling factor multiplies it.
  [[nodiscard]] float current_lr() const {
    const double consumed = static_cast<double>(sampler.epoch()) * static_cast<double>(data.train.size()) +
                            static_cast<double>(sampler.cursor());
    const auto pos = static_cast<std::int64_t>(consumed / base_batch);
    return static_cast<float>(schedule->lr(pos) * lr_factor(step));
  }

  /// After every resize: the lr factor for the new global batch (--lr-scaling), reached at once when it
  /// goes down and over --rescale-ramp-steps when it goes up. Local; logged as a `rescale` event.
  void rescale(int from_world, const char* why) {
    const int world = backend->size();
    const double ratio = static_cast<double>(step_batch(world)) / base_batch;
    double f = 1;
    if (cfg.lr_scaling == "linear") f = ratio;
    if (cfg.lr_scaling == "sqrt") f = std::sqrt(ratio);
    const double now = lr_factor(step);
    factor_from = now;
    factor_to = f;
    ramp_start = step;
    ramp_steps = f > now ? cfg.rescale_ramp_steps : 0;
    const std::size_t micro = static_cast<std::size_t>(world) * cfg.batch_size;
    metrics.write({{"event", "rescale"},
                   {"reason", why},
                   {"step", step},
                   {"from_world_size", from_world},
                   {"world_size", world},
                   {"lr_scaling", cfg.lr_scaling},
                   {"global_batch", step_batch(world)},
                   {"accumulation", (step_batch(world) + micro - 1) / micro},
                   {"lr_factor_from", now},
                   {"lr_factor_to", f},
                   {"ramp_steps", ramp_steps}});
    if (backend->rank() == 0 && from_world != world) {
      spdlog::info("rescale ({}): {} -> {} ranks, global batch {}, lr factor {:.3g} -> {:.3g}{}", why,
                   from_world, world, step_batch(world), now, f,
                   ramp_steps > 0 ? fmt::format(" over {} steps", ramp_steps) : "");
    }
  }

  // ---- checkpoints -----------------------------------------------------------------------------------

  /// Collective. Throws CheckpointError (same on every rank) if it could not be written. With
  /// --checkpoint-async only periodic checkpoints go to the background; a stop or the end is synchronous.
  void save(const char* why, bool async) {
    if (step == ckpt_fault_step && ckpt_fault_phase != checkpoint::WritePhase::kNone)
      writer->arm_fault(ckpt_fault_phase, backend->rank());
    for (const auto& f : faults) {
      if (generation == 0 && f.phase == FaultPhase::kCheckpointWrite && f.rank == group.launch_rank() &&
          f.step == step)
        writer->arm_fault(checkpoint::WritePhase::kAfterShardData, backend->rank());
    }
    algorithm->consensus();  // one model: decentralized ranks' models differ between consensus points
    if (async) {
      if (writer->save_async(snapshot())) pending_reason = why;
      return;
    }
    if (auto r = writer->finish_async()) report(*r, pending_reason.c_str());
    report(writer->save(snapshot()), why);
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
  void checkpoint_or_report(const char* why, Summary& sum, bool async = false) {
    try {
      save(why, async);
    } catch (const CheckpointError& e) {
      failed_checkpoint(why, e, sum);
    }
  }

  /// Moves the asynchronous checkpoint in flight on (collective): with `wait`, to its commit, waiting as
  /// needed; without, to its next stage (the caller has agreed that every rank is ready for it).
  void finish_checkpoint(Summary& sum, bool wait = true) {
    try {
      if (auto r = wait ? writer->finish_async() : writer->progress_async())
        report(*r, pending_reason.c_str());
    } catch (const CheckpointError& e) {
      failed_checkpoint(pending_reason.c_str(), e, sum);
    }
  }

  void failed_checkpoint(const char* why, const CheckpointError& e, Summary& sum) {
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
    const auto load_start = Clock::now();
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
    step = st.step;
    metrics.write({{"event", "resume"},
                   {"path", path},
                   {"step", st.step},
                   {"epoch", st.epoch},
                   {"cursor", st.cursor},
                   {"from_world_size", st.world_size},
                   {"world_size", backend->size()},
                   {"load_ms", ms_since(load_start)},
                   {"generation", generation},
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
    // Per-rank algorithm state: this rank's block when the world size is the same, otherwise the blocks'
    // sum spread evenly (what an error-feedback residual owes the group is kept); absent: zeros.
    const auto world = static_cast<std::size_t>(backend->size()),
               rank = static_cast<std::size_t>(backend->rank());
    for (auto& [name, buf] : algorithm->rank_state()) {
      std::fill(buf.begin(), buf.end(), 0.f);
      auto it = st.tensors.find(name);
      if (it == st.tensors.end() || buf.empty()) continue;
      const auto& v = it->second;
      const std::size_t blocks = v.size() / buf.size();
      if (blocks * buf.size() != v.size() || blocks == 0)
        SINEW_THROW(CheckpointError, "{}: tensor '{}' has {} elements, not a multiple of {}", path, name,
                    v.size(), buf.size());
      if (blocks == world) {
        std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(rank * buf.size()), buf.size(), buf.begin());
        continue;
      }
      for (std::size_t b = 0; b < blocks; ++b)
        for (std::size_t i = 0; i < buf.size(); ++i) buf[i] += v[b * buf.size() + i];
      for (auto& x : buf) x /= static_cast<float>(world);
    }
    sampler.set_position(st.epoch, st.cursor);
    // A checkpoint at an epoch's end may precede that epoch's evaluation: evaluate it (again) after resuming.
    last_eval_epoch = st.epoch - 1;
  }

  // ---- evaluation ------------------------------------------------------------------------------------

  /// Test-set loss and accuracy; every rank evaluates a contiguous shard, the sums are reduced.
  std::pair<double, double> evaluate() {
    algorithm->consensus();  // evaluate the group's one model
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

  // ---- one step --------------------------------------------------------------------------------------

  struct Window {
    double loss = 0, step_ms = 0, comm_ms = 0;
    std::int64_t steps = 0, samples = 0;
    std::uint64_t bytes_sent = 0;  // by this rank, for the algorithm
    double total_step_ms = 0, total_comm_ms = 0;
    std::int64_t total_steps = 0;
    Clock::time_point last_progress = Clock::now();
  };

  /// Steps left at the current size: the rest of this epoch, then whole epochs (for progress and ETA).
  [[nodiscard]] std::int64_t steps_remaining() const {
    const auto g = static_cast<double>(step_batch(backend->size()));
    const auto n = static_cast<double>(data.train.size());
    const double rest = std::ceil(static_cast<double>(data.train.size() - sampler.cursor()) / g);
    std::int64_t left =
        static_cast<std::int64_t>(rest) + static_cast<std::int64_t>(std::ceil(n / g)) *
                                              std::max<std::int64_t>(0, cfg.epochs - 1 - sampler.epoch());
    if (cfg.max_steps > 0) left = std::min(left, cfg.max_steps - step);
    return left;
  }

  /// One optimiser step: the step's samples (several micro-batches with --global-batch), forward,
  /// backward with buckets reduced as they fill, the fused optimiser step; then the position advances.
  void train_step(Summary& sum, Window& w) {
    const int rank = backend->rank(), world = backend->size();
    const auto ts = Clock::now();
    const std::size_t micro = static_cast<std::size_t>(world) * cfg.batch_size;
    const std::size_t total = std::min(step_batch(world), data.train.size() - sampler.cursor());
    const std::size_t k = (total + micro - 1) / micro;
    const float lr = current_lr();
    if (k > 1) accum.assign(net.num_params(), 0.f);
    float local_loss = 0;
    bool first_ready = true;
    const bool reduce = algorithm->reduces_gradients(step + 1);
    auto ready = [&](model::ParamRange r) {
      if (k > 1) {
        auto g = net.grads().subspan(r.offset, r.count);
        const float* a = accum.data() + r.offset;
        for (std::size_t i = 0; i < r.count; ++i) g[i] += a[i];
      }
      if (!reduce) return;
      bucketer->mark_ready({r.offset, r.count});
      if (first_ready) {
        first_ready = false;
        inject(FaultPhase::kAllreduce);  // the peers are now inside the gradient allreduce
      }
    };
    for (std::size_t j = 0; j < k; ++j) {
      const std::size_t offset = j * micro;
      const auto batch = sampler.peek_range(rank, world, offset, std::min(micro, total - offset));
      audit.record(generation, group.epoch(), step + 1, sampler.epoch(), batch.indices);
      const bool last = j + 1 == k;
      if (!batch.indices.empty()) {
        if (j == 0) inject(FaultPhase::kForward);
        const auto n = static_cast<Eigen::Index>(batch.indices.size());
        x_.resize(data.train.dim(), n);
        labels_.resize(batch.indices.size());
        data.train.gather(batch.indices, x_.data(), labels_.data());
        const Matrix& logits = net.forward(x_);
        // Dividing by the step's global count makes the summed gradients the exact global mean.
        local_loss += model::softmax_cross_entropy(logits, labels_, dlogits_, static_cast<double>(total));
        if (j == 0) inject(FaultPhase::kBackward);
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
      bucketer->finish();
      comm_ms = bucketer->last_comm_ms();
    }
    // Without a gradient reduction the algorithm communicates in its step (qadam) or after it: the peers
    // are about to enter that exchange.
    if (!reduce) inject(FaultPhase::kAllreduce);
    inject(FaultPhase::kOptimizer);
    algorithm->step(step + 1, lr);
    const auto ta = Clock::now();
    algorithm->after_step(step + 1);
    if (!reduce) comm_ms += ms_since(ta);
    sampler.advance(total);
    ++step;
    const double step_ms = ms_since(ts);
    const auto sent = algorithm->take_bytes_sent();
    w.bytes_sent += sent;
    sum.bytes_sent += sent;
    w.step_ms += step_ms;
    w.comm_ms += comm_ms;
    w.total_step_ms += step_ms;
    w.total_comm_ms += comm_ms;
    ++w.total_steps;
    w.loss += local_loss;
    w.samples += static_cast<std::int64_t>(total);
    sum.samples += static_cast<std::int64_t>(total);
    ++w.steps;
    if (pending.active) {  // the first step after a recovery completed: the recovery is over
      pending.active = false;
      pending.event["first_step_ms"] = step_ms;
      pending.event["total_ms"] = ms_since(pending.detected);
      pending.event["step"] = step;
      metrics.write(pending.event);
      if (rank == 0) {
        spdlog::info("recovered: first step done {:.1f} ms after the failure was detected",
                     pending.event["total_ms"].get<double>());
      }
    }
    const bool epoch_end = sampler.epoch_done();
    if (step % cfg.log_every == 0 || epoch_end || (cfg.max_steps > 0 && step >= cfg.max_steps)) {
      double agg[1] = {w.loss};  // each rank's loss share sums to the global mean loss
      backend->allreduce_sync(comm::Buffer::of(std::span<double>(agg)), comm::ReduceOp::kSum, op);
      const double mean_loss = agg[0] / static_cast<double>(w.steps);
      sum.final_train_loss = mean_loss;
      const double sps = static_cast<double>(w.samples) / (w.step_ms / 1e3);
      metrics.write(
          {{"step", step},
           {"epoch", sampler.epoch()},
           {"world_size", world},
           {"loss", mean_loss},
           {"lr", lr},
           {"samples_per_s", std::round(sps)},
           {"step_ms", w.step_ms / static_cast<double>(w.steps)},
           {"comm_ms", w.comm_ms / static_cast<double>(w.steps)},
           {"exposed_comm_ms", bucketer->last_exposed_ms()},
           {"bytes_sent_per_step", static_cast<double>(w.bytes_sent) / static_cast<double>(w.steps)}});
      if (rank == 0 && cfg.progress && seconds_since(w.last_progress) > 2.0) {
        w.last_progress = Clock::now();
        const std::int64_t left = steps_remaining();
        const double eta =
            (w.total_step_ms / static_cast<double>(w.total_steps)) * static_cast<double>(left) / 1e3;
        spdlog::info("epoch {}/{} step {}/{} loss {:.4f} lr {:.4g} {} ranks {:.0f} samples/s ETA {:.0f}s",
                     sampler.epoch() + 1, cfg.epochs, step, step + left, mean_loss, lr, world, sps, eta);
      }
      w.loss = w.step_ms = w.comm_ms = 0;
      w.steps = w.samples = 0;
      w.bytes_sent = 0;
    }
  }

  // ---- control: signals, leave requests, job-server resizes, checkpoints ------------------------------

  /// The size the group should have now: the job server's schedule, or after ranks left on request that
  /// size, else --max-ranks (or the launch size).
  [[nodiscard]] int target_size() const {
    int t = cfg.max_ranks > 0 ? cfg.max_ranks : launch_world;
    if (target_override > 0) t = target_override;
    for (const auto& [at, size] : schedule_points)
      if (step >= at) t = size;
    return t;
  }

  enum class After { kContinue, kStop, kLeft };

  After control(Summary& sum) {
    const int rank = backend->rank(), world = backend->size();
    const bool checkpoint_due = writer && cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0;
    const bool resize_due = !schedule_points.empty() && target_size() != world;
    if (step % kControlEvery != 0 && !checkpoint_due && !resize_due) return After::kContinue;
    const auto tc = Clock::now();
    // One small collective agrees on a stop signal (which may reach only some ranks), on leave requests,
    // and on whether every rank is done with its part of the background checkpoint's current stage.
    std::vector<std::int64_t> control(2 + static_cast<std::size_t>(world), 0);
    control[0] = g_stop_signal.load();
    control[1] = writer && writer->async_in_flight() && !writer->async_ready() ? 1 : 0;
    control[2 + static_cast<std::size_t>(rank)] = g_leave_signal.load() != 0 ? 1 : 0;
    backend->allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(control)), comm::ReduceOp::kMax, op);
    std::vector<bool> leaving(static_cast<std::size_t>(world), false);
    int asked = 0;
    for (int r = 0; r < world; ++r) {
      leaving[static_cast<std::size_t>(r)] = control[2 + static_cast<std::size_t>(r)] != 0;
      asked += leaving[static_cast<std::size_t>(r)] ? 1 : 0;
    }
    After next = After::kContinue;
    if (control[0] != 0) {
      next = After::kStop;
      sum.stopped_by_signal = static_cast<int>(control[0]);
      if (rank == 0)
        spdlog::warn("signal {} received: checkpointing at step {} and stopping", control[0], step);
    }
    if (writer && writer->async_in_flight() && (control[1] == 0 || asked > 0 || resize_due))
      finish_checkpoint(sum, /*wait=*/asked > 0 || resize_due);
    if (writer && (next == After::kStop || checkpoint_due)) {
      checkpoint_or_report(next == After::kStop ? "signal" : "periodic", sum,
                           cfg.checkpoint_async && next != After::kStop && asked == 0 && !resize_due);
    }
    sum.checkpoint_ms += ms_since(tc);
    if (next == After::kStop) return next;
    if (asked > 0 && asked < world) {
      target_override = world - asked;
      if (leave(leaving, "requested")) return After::kLeft;
    }
    const int target = target_size();
    if (target < backend->size()) {
      std::vector<bool> extra(static_cast<std::size_t>(backend->size()), false);
      for (int r = target; r < backend->size(); ++r) extra[static_cast<std::size_t>(r)] = true;
      if (leave(extra, "job server")) return After::kLeft;
    } else if (target > backend->size() && !schedule_points.empty()) {
      grow_to(target, "job server");
    }
    return After::kContinue;
  }

  /// Collective: the members marked in `leaving` leave the group at this step boundary (not a failure);
  /// the others continue over a new view. Returns true on a leaving rank.
  bool leave(const std::vector<bool>& leaving, const char* why) {
    const auto t = Clock::now();
    const int from = backend->size();
    const bool me = leaving[static_cast<std::size_t>(backend->rank())];
    algorithm->consensus();  // what the leaving ranks learned stays with the group
    if (me) spdlog::info("leaving the group at step {} ({})", step, why);
    disconnect_clean();
    group.split_leave(me);
    if (me) return true;
    connect();
    metrics.write({{"event", "shrink"},
                   {"reason", "leave"},
                   {"why", why},
                   {"step", step},
                   {"from_world_size", from},
                   {"world_size", backend->size()},
                   {"membership_epoch", group.epoch()},
                   {"ms", ms_since(t)}});
    rescale(from, "leave");
    return false;
  }

  /// Drops the per-view objects without revoking (a planned change, every member agrees), in dependency
  /// order: the bucketer's thread and the writer use the backend.
  void disconnect_clean() noexcept {
    bucketer.reset();
    algorithm.reset();
    writer.reset();
    backend.reset();
  }

  /// Collective: spawns members up to `target` (job server, or growing back after failures).
  void grow_to(int target, const char* why) {
    const int from = backend->size();
    disconnect_clean();
    const auto t = Clock::now();
    inject(FaultPhase::kSpawn);
    membership::GrowReport rep;
    try {
      Watchdog dog(op.timeout, fmt::format("growing the group from {} to {} ranks", from, target));
      rep = group.grow(target - from);
    } catch (const membership::SpawnError& e) {
      // Every member is alive and the view unchanged: go on at this size, and do not try again (until the
      // job server asks for another size).
      connect();
      target_override = from;
      metrics.write({{"event", "grow"},
                     {"reason", why},
                     {"step", step},
                     {"from_world_size", from},
                     {"world_size", from},
                     {"error", e.message()}});
      if (backend->rank() == 0) {
        spdlog::warn("cannot grow to {} ranks ({}); continuing with {}", target, e.message(), from);
      }
      return;
    }
    const auto tc = Clock::now();
    connect();
    const double connect_ms = ms_since(tc);
    const double sync_ms = synchronise();
    metrics.write({{"event", "grow"},
                   {"reason", why},
                   {"step", step},
                   {"from_world_size", from},
                   {"world_size", backend->size()},
                   {"membership_epoch", group.epoch()},
                   {"spawn_ms", rep.spawn_ms},
                   {"merge_ms", rep.merge_ms},
                   {"rebuild_ms", connect_ms},
                   {"sync_ms", sync_ms},
                   {"ms", ms_since(t)}});
    if (backend->rank() == 0) {
      spdlog::info("grew from {} to {} ranks ({}): spawn {:.0f} ms, state sync {:.1f} ms", from,
                   backend->size(), why, rep.spawn_ms, sync_ms);
    }
    rescale(from, "grow");
  }

  // ---- recovery --------------------------------------------------------------------------------------

  /// In-place recovery after `e` (a failed or revoked collective): shrink to the survivors, grow back if
  /// asked to, rebuild the backends, take the state of the most advanced survivor. Retried if members
  /// fail meanwhile. Returns false if the group fell below --min-ranks (it then checkpointed).
  bool recover(const CommFailure& e, Summary& sum, Window& w) {
    const auto detected = Clock::now();
    const double detected_unix = unix_now_s();
    const int from = backend ? backend->size() : group.size();
    const std::int64_t at_step = step;
    ++sum.failures;
    spdlog::warn("failure at step {}: {}; recovering in place", step + 1, e.message());
    nlohmann::json ev = {{"event", "failure"},
                         {"step", at_step},
                         {"error", e.message()},
                         {"from_world_size", from},
                         {"detected_unix_time", detected_unix}};
    double revoke_ms = 0, shrink_ms = 0, agree_ms = 0, spawn_ms = 0, rebuild_ms = 0, sync_ms = 0;
    int attempts = 0, lost = 0;
    for (;;) {
      try {
        // Revoke the backend's communicator first (shrink() only revokes the group's own), so that
        // every member blocked in it returns and reaches the shrink.
        if (backend) backend->abort();
        const auto rep = group.shrink([this](int) { inject(FaultPhase::kRecovery); });
        // The revoke made every collective on the old view return: the communication thread is free.
        disconnect_clean();
        revoke_ms += rep.revoke_ms;
        shrink_ms += rep.shrink_ms;
        agree_ms += rep.agree_ms;
        attempts += rep.attempts;
        lost += rep.lost;
        auto t = Clock::now();
        connect();
        rebuild_ms = ms_since(t);
        sync_ms = synchronise();
        rescale(from, "failure");
        // Every survivor now holds the same position, hence the same target.
        if (cfg.grow && target_size() > backend->size()) {
          const auto tg = Clock::now();
          grow_to(target_size(), "replace failed ranks");
          spawn_ms += ms_since(tg);
        }
        break;
      } catch (const CommFailure& again) {
        spdlog::warn("another failure during recovery: {}; recovering again", again.message());
        disconnect();  // revokes the backend's communicator (if it was rebuilt) before freeing it
      }
    }
    ev["world_size"] = backend->size();
    ev["lost"] = lost;
    ev["attempts"] = attempts;
    ev["membership_epoch"] = group.epoch();
    ev["revoke_ms"] = revoke_ms;
    ev["shrink_ms"] = shrink_ms;
    ev["agree_ms"] = agree_ms;
    ev["spawn_ms"] = spawn_ms;
    ev["rebuild_ms"] = rebuild_ms;
    ev["sync_ms"] = sync_ms;
    ev["resumed_step"] = step;
    ev["role"] = membership::role_name(group.role());
    metrics.write(ev);
    metrics.write({{"event", "shrink"},
                   {"reason", "failure"},
                   {"step", step},
                   {"from_world_size", from},
                   {"world_size", from - lost},
                   {"membership_epoch", group.epoch()}});
    if (backend->rank() == 0) {
      spdlog::warn(
          "recovered in place: {} -> {} ranks{} (revoke {:.1f} ms, shrink {:.1f} ms, agree {:.1f} ms, "
          "rebuild {:.1f} ms, state sync {:.1f} ms); continuing at step {}",
          from, from - lost,
          backend->size() > from - lost
              ? fmt::format(", grown back to {} (spawn {:.0f} ms)", backend->size(), spawn_ms)
              : "",
          revoke_ms, shrink_ms, agree_ms, rebuild_ms, sync_ms, step + 1);
    }
    w.loss = w.step_ms = w.comm_ms = 0;  // the window's partial sums included the lost step
    w.steps = w.samples = 0;
    pending.active = true;
    pending.detected = detected;
    pending.event = {
        {"event", "recovered"}, {"world_size", backend->size()}, {"membership_epoch", group.epoch()}};
    if (backend->size() < cfg.min_ranks) {
      sum.below_min_ranks = true;
      if (backend->rank() == 0) {
        spdlog::error("only {} ranks left, below --min-ranks {}: checkpointing step {} and stopping",
                      backend->size(), cfg.min_ranks, step);
      }
      if (writer) checkpoint_or_report("min-ranks", sum);
      return false;
    }
    return true;
  }

  // ---- the loop --------------------------------------------------------------------------------------

  /// Evaluates on the test set and reports it (summary, metrics, log line).
  void evaluate_and_report(Summary& sum) {
    const auto [test_loss, test_acc] = evaluate();
    sum.test_accuracy = test_acc;
    sum.test_loss = test_loss;
    sum.epochs = static_cast<int>(sampler.epoch()) + 1;
    metrics.write({{"event", "eval"},
                   {"epoch", sampler.epoch()},
                   {"step", step},
                   {"world_size", backend->size()},
                   {"test_accuracy", test_acc},
                   {"test_loss", test_loss}});
    if (backend->rank() == 0 && sampler.epoch_done()) {
      spdlog::info("epoch {} done: test accuracy {:.2f}% (loss {:.4f})", sampler.epoch() + 1, 100 * test_acc,
                   test_loss);
    }
  }

  /// Trains until the end (or a stop); resumable: after a recovery it continues from the synchronised
  /// position. Throws CommFailure on a failure.
  After train_loop(Summary& sum, Window& w) {
    for (;;) {
      if (sampler.epoch_done()) {
        if (last_eval_epoch < sampler.epoch()) {
          evaluate_and_report(sum);
          last_eval_epoch = sampler.epoch();
        }
        if (sampler.epoch() + 1 >= cfg.epochs || (cfg.max_steps > 0 && step >= cfg.max_steps)) break;
        sampler.start_epoch(sampler.epoch() + 1);
        continue;
      }
      if (cfg.max_steps > 0 && step >= cfg.max_steps) {
        evaluate_and_report(sum);  // stopped inside an epoch: evaluate what was trained
        break;
      }
      train_step(sum, w);
      if (cfg.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cfg.step_sleep_ms));
      const After a = control(sum);
      if (a != After::kContinue) return a;
    }
    if (writer) checkpoint_or_report("end", sum);
    return After::kContinue;
  }

  Summary run() {
    Summary sum;
    const auto t0 = Clock::now();
    Window w;
    if (backend->rank() == 0 && group.role() == membership::Role::kInitial) {
      spdlog::info(
          "training {} ({} parameters) on {} ({} train / {} test samples), {} ranks x batch {}, {} steps",
          cfg.model, net.num_params(), cfg.dataset, data.train.size(), data.test.size(), backend->size(),
          cfg.batch_size, step + steps_remaining());
      metrics.write({{"event", "start"},
                     {"world_size", backend->size()},
                     {"model", cfg.model},
                     {"dataset", cfg.dataset},
                     {"params", net.num_params()},
                     {"batch_size", cfg.batch_size},
                     {"global_batch", step_batch(backend->size())},
                     {"steps", step + steps_remaining()},
                     {"buckets", bucketer->num_buckets()},
                     {"elastic", cfg.elastic},
                     {"mpi", mpi::library_version()},
                     {"ulfm", mpi::ulfm_enabled()}});
    }
    const bool inplace = cfg.elastic == "inplace" && mpi::ulfm_enabled();
    After end = After::kContinue;
    for (;;) {
      try {
        end = train_loop(sum, w);
        if (end == After::kStop && writer && writer->async_in_flight()) finish_checkpoint(sum);
        break;
      } catch (const CommFailure& e) {
        if (!inplace) {
          if (cfg.elastic == "off") throw;
          // Restart mode (asked for, or no usable ULFM): the supervisor relaunches from the checkpoint.
          SINEW_THROW(RelaunchRequest, "{}; exiting for a relaunch from the latest checkpoint (--elastic {})",
                      e.message(), cfg.elastic);
        }
        if (!recover(e, sum, w)) break;
      }
    }
    if (end == After::kLeft) {
      sum.left = true;
      return sum;
    }
    sum.steps = step;
    sum.world_size = backend->size();
    sum.wall_s = seconds_since(t0);
    sum.mean_step_ms = w.total_steps > 0 ? w.total_step_ms / static_cast<double>(w.total_steps) : 0;
    sum.mean_comm_ms = w.total_steps > 0 ? w.total_comm_ms / static_cast<double>(w.total_steps) : 0;
    sum.samples_per_s = static_cast<double>(sum.samples) / (w.total_step_ms / 1e3);
    metrics.write(
        {{"event", "done"},
         {"test_accuracy", sum.test_accuracy},
         {"test_loss", sum.test_loss},
         {"train_loss", sum.final_train_loss},
         {"steps", sum.steps},
         {"epochs", sum.epochs},
         {"samples", sum.samples},
         {"world_size", sum.world_size},
         {"failures", sum.failures},
         {"wall_s", sum.wall_s},
         {"step_ms", sum.mean_step_ms},
         {"comm_ms", sum.mean_comm_ms},
         {"samples_per_s", std::round(sum.samples_per_s)},
         {"train_s", w.total_step_ms / 1e3},
         {"algorithm", algorithm->name()},
         {"bytes_sent_per_step",
          sum.steps > 0 ? static_cast<double>(sum.bytes_sent) / static_cast<double>(sum.steps) : 0.0},
         {"stopped_by_signal", sum.stopped_by_signal},
         {"below_min_ranks", sum.below_min_ranks},
         {"checkpoint_error", sum.checkpoint_error}});
    return sum;
  }

  Matrix x_, dlogits_;
  std::vector<std::int32_t> labels_;
};

Trainer::Trainer(Config config, const mpi::Communicator& comm)
    : impl_(std::make_unique<Impl>(std::move(config), membership::Group::over(comm))) {}
Trainer::Trainer(Config config, membership::Group group)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(group))) {}
Trainer::~Trainer() = default;
Summary Trainer::run() { return impl_->run(); }
const model::Model& Trainer::model() const { return impl_->net; }
int Trainer::rank() const { return impl_->group.rank(); }

}  // namespace sinew::train
