#include "sinew/train/session.hpp"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sinew/checkpoint/writer.hpp"
#include "sinew/core/launch.hpp"
#include "sinew/core/memory_limit.hpp"
#include "sinew/core/pages.hpp"
#include "sinew/core/status.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/train/audit.hpp"
#include "sinew/train/checkpoints.hpp"
#include "sinew/train/control.hpp"
#include "sinew/train/device.hpp"
#include "sinew/train/elastic.hpp"
#include "sinew/train/events.hpp"
#include "sinew/train/fabric.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/reducer.hpp"
#include "sinew/train/replicated_state.hpp"
#include "sinew/train/rescale.hpp"
#include "sinew/train/run_metrics.hpp"
#include "sinew/train/shards.hpp"

namespace sinew::train {

using fault::Point;

namespace {

double ms_since(Clock::time_point t) { return seconds_since(t) * 1e3; }

}  // namespace

struct Session::Impl {
  Config cfg;
  /// Restart generation (core/launch.hpp: Slurm's requeues and sinew-supervise's relaunches combined):
  /// orders the audit records of successive launches, makes a relaunch append to the metrics and disables
  /// fault injection.
  int generation = launch::current().restart_generation();
  membership::Group group;
  workload::Workload& work;
  SessionParts parts;
  fault::Plan faults;
  data::DistributedSampler sampler;
  /// --shard optimizer: this member's shards of the optimiser state (the workload has none).
  std::unique_ptr<ShardedOptimizer> shards;
  ReplicatedState state;
  Events events;
  AuditLog audit;
  StepControl control;
  LrRescaler lr;
  FabricSetup setup;
  ElasticController elastic;
  CheckpointPolicy checkpoints;

  RunMetrics metrics;
  Summary& sum;                  // metrics.summary()
  bool ended = false;            // next() says kDone from now on
  bool kept_sharded = false;     // --shard parameters: training ended without the model gathered whole
  After end = After::kContinue;  // how the run ended
  bool final_evaluated = false;  // --max-steps inside an epoch: the last step was evaluated

  // The step being trained.
  StepPlan plan;
  Clock::time_point step_start;
  data::DistributedSampler::Batch batch;
  Reducer reducer;
  double gather_ms = 0;  // --shard optimizer: the parameters' gather, part of the step's communication
  struct Prefetch {      // --shard parameters: a unit's gather handed to the communication thread
    std::uint64_t ticket = 0;
    std::vector<Slice> ranges;
    comm::Bucketer::Ticket posted;
  };
  std::vector<Prefetch> prefetched;  // not yet waited for, in the order posted
  std::uint64_t next_ticket = 1;

  TeacherFeed teacher_feed;  // --distill-*

  Impl(Config c, membership::Group g, workload::Workload& w, SessionParts p)
      : cfg(std::move(c)),
        group(std::move(g)),
        work(w),
        parts(std::move(p)),
        faults(cfg.inject_fault, group.launch_rank(), generation),
        sampler(parts.train_size, cfg.seed, cfg.shuffle),
        shards(make_sharded_optimizer(cfg, work)),
        state(work, sampler, cfg.seed),
        // A relaunch (sinew-supervise's restart mode, a requeued Slurm job) appends to the first launch's
        // metrics.
        events(cfg.metrics, group.rank() == 0 && group.role() != membership::Role::kRecovered,
               generation > 0),
        audit(cfg.audit_dir.empty() ? AuditLog() : AuditLog(cfg.audit_dir)),
        control(parse_resize_schedule(cfg.resize_schedule), cfg.max_ranks, cfg.checkpoint_every),
        lr(cfg, parts.train_size),
        setup(fabric_setup()),
        elastic(cfg, group, setup, state, lr, control, events, faults),
        checkpoints(cfg, setup.op, state, events, generation),
        metrics(cfg, events),
        sum(metrics.summary()),
        // The peers are now inside the gradient reduction.
        reducer(work, cfg.find_unused_parameters, [this] { faults.at(Point::kAllreduce, plan.step); }),
        // Before the group's first collective, so that a teacher that cannot be used fails the launch
        // cleanly.
        teacher_feed(cfg, parts.distiller, group.launch_rank(), group.rank(), group.size(),
                     group.rank() == 0 && group.role() == membership::Role::kInitial) {
    if (cfg.algorithm == algo::Kind::kAuto && !parts.compute_ms)
      SINEW_THROW(InvalidArgument,
                  "--algorithm auto needs a measure of a step's computation; this driver "
                  "gives none: choose the algorithm");
    state.attach_shards(shards.get());
    if (!cfg.state_mirror.empty()) {
      const std::string off = state.attach_mirror(cfg.state_mirror);
      if (!off.empty() && group.rank() == 0 && group.role() == membership::Role::kInitial)
        spdlog::info("--state-mirror: off {}; a relaunch starts from the newest checkpoint", off);
    }
    if (group.spare()) {
      // A hot spare: the data and the model are loaded; it waits in start() until it is promoted.
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
      state.take_rank0(fabric().backend(), setup.op);
      if (shards) arrange_shards();
      work.to_device();
      checkpoints.resume(fabric());
      if (state.mirrored() && cfg.resume == "auto") elastic.resume_from_mirror(generation);
      lr.start(state.pos(), group.size());
      if (!fabric().algorithm().lockstep()) state.mark_agreed();
      // --shard parameters: the model was whole until now (its initial or loaded values); from here on
      // this member keeps its shards of it in memory, and units are gathered when they run.
      if (shards && shards->parameters_sharded()) {
        shards->release_unheld(work.params());
        trim_heap();
      }
    }
    lr.build_schedule(state.pos());
  }

  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;
  ~Impl() = default;

  Fabric& fabric() { return elastic.fabric(); }

  /// A first launch: this member's shards.
  void arrange_shards() {
    shards->arrange(fabric().rank(), fabric().size(), work.params());
    if (fabric().rank() == 0) spdlog::info("{}", describe(*shards));
  }

  /// The parameters whole on this member: after a sharded update, each owner's range from its owner.
  void gather_shards() {
    if (!shards || !shards->stale()) return;
    const auto t = Clock::now();
    if (comm::Backend* nccl = fabric().device_backend()) {
      shards->gather(*nccl, work.device_params(), setup.op);  // in device memory (the host record is stale)
    } else {
      shards->gather(fabric().backend(), work.params(), setup.op);
    }
    gather_ms += ms_since(t);
  }

  [[nodiscard]] std::int64_t step() const { return state.pos().step; }

  FabricSetup fabric_setup() {
    FabricSetup s = fabric_options(cfg);
    s.faults = &faults;
    s.work = &work;
    s.compute_ms = parts.compute_ms;
    s.nccl_api = parts.nccl_api;
    s.algorithm_event = [this](const nlohmann::json& ev) {
      events.emit(AlgorithmEvent{ev, step()});
      if (group.rank() == 0)
        spdlog::info("algorithm: {} ({})", ev.value("chosen", ""), ev.value("reason", ""));
    };
    if (work.on_device()) s.attach_device = [this](comm::Backend& view) { return attach_device(view); };
    if (cfg.shard != ShardStage::kNone) s.optimizer_step = [this](float rate) { step_shards(rate); };
    if (cfg.shard == ShardStage::kParameters) s.bucket_backlog = 2;
    if (cfg.shard == ShardStage::kGradients && work.on_device()) {
      s.device_scatter = [this](comm::Backend& nccl, float* data, std::size_t count, std::size_t offset) {
        return shards->scatter_bucket_device(nccl, {data, count}, offset, setup.op);
      };
    } else if (cfg.shard == ShardStage::kGradients || cfg.shard == ShardStage::kParameters) {
      s.scatter_bucket = [this](comm::Backend& b, std::span<float> bucket, std::size_t offset,
                                const algo::Quantization* q) {
        shards->scatter_bucket(b, bucket, offset, setup.op, q);
      };
    }
    return s;
  }

  /// A sharded update. On a GPU the shards are stepped on the host (their state is there, ZeRO-Offload's
  /// placement): the held ranges' reduced gradients come device -> host and their updated parameters go
  /// back, and gather_shards() all-gathers them in device memory.
  void step_shards(float rate) {
    const std::vector<Slice> held = shards->held_ranges();
    work.grads_to_host(held);
    shards->step(work.params(), work.grads(), rate);
    work.params_to_device(held);
  }

  /// A workload on a GPU, in every fabric's construction (collective): a member keeps its GPU; the first
  /// fabric of a member (at launch, or a spawned replacement's) picks a free one and the workload copies
  /// its state there.
  float* attach_device(comm::Backend& view) {
    const bool first = work.device() < 0;
    const int d = choose_device(view, setup.op, work.device(), work.visible_devices());
    float* grads = work.attach_device(d);
    if (first && view.rank() == 0) spdlog::info("training on one GPU per rank; rank 0: {}", work.describe());
    return grads;
  }

  // ---- what next ---------------------------------------------------------------------------------------

  Next next() {
    for (;;) {
      if (ended) return Next::kDone;
      const bool max_reached = cfg.max_steps > 0 && step() >= cfg.max_steps;
      if (sampler.epoch_done()) {
        if (state.pos().last_eval_epoch < sampler.epoch()) return Next::kEvaluate;
        if (sampler.epoch() + 1 >= cfg.epochs || max_reached) {
          finish_training();
          continue;
        }
        sampler.start_epoch(sampler.epoch() + 1);
        continue;
      }
      if (max_reached) {
        // Stopped inside an epoch: evaluate what was trained, then end.
        if (!final_evaluated) return Next::kEvaluate;
        finish_training();
        continue;
      }
      return Next::kStep;
    }
  }

  /// --shard parameters, at the end: whether this member can hold the model whole beside what it uses now,
  /// under its memory cgroup's limit (none: yes, as without sharding), and Config::whole_at_end (the script's
  /// check at start).
  bool room_for_whole_model() const {
    if (!cfg.whole_at_end) return false;
    const auto m = memory_limit();
    if (!m) return true;
    std::size_t held = 0;
    for (const Slice r : shards->held_ranges()) held += r.count;
    const std::uint64_t more = sizeof(float) * (work.params().size() - held);
    const std::uint64_t margin = std::max<std::uint64_t>(std::uint64_t{32} << 20, m->limit / 32);
    if (m->used + more + margin <= m->limit) return true;
    spdlog::warn(
        "the model whole needs {:.0f} MiB more on this rank than its {:.0f} MiB: its memory cgroup ({}) "
        "allows {:.0f} MiB (less a margin of {:.0f})",
        static_cast<double>(more) / (1 << 20), static_cast<double>(m->used) / (1 << 20), m->where,
        static_cast<double>(m->limit) / (1 << 20), static_cast<double>(margin) / (1 << 20));
    return false;
  }

  void finish_training() {
    gather_shards();  // the model the run ends with, whole on every member
    if (!shards || !shards->parameters_sharded()) {
      checkpoints.save(fabric(), "end");
      ended = true;
      return;
    }
    // Sharded parameters too: the gradients are done with. The end checkpoint comes first, from the shards:
    // it holds the trained model whatever follows, and its buffers are gone before the model is made whole.
    release_pages(work.grads());  // (the edges keep a page each: no matter, nothing reads them)
    const bool committed = checkpoints.save(fabric(), "end");
    // Once every member's end checkpoint is committed, the optimiser's state has no reader left (a script's
    // optimizer.state_dict() is refused while the state is sharded): its memory, AdamW's 8 bytes per
    // element held, is given back before the model is made whole, so that the end's peak stays below
    // training's. A failure from here on ends in a relaunch from that checkpoint, which finishes at once
    // (reshard() refuses). Without a committed end checkpoint the state stays, and a failure in the gather
    // below is recovered in place as in training.
    std::array<double, 1> all{committed ? 1.0 : 0.0};
    fabric().backend().allreduce_sync(comm::Buffer::of(std::span<double>(all)), comm::ReduceOp::kMin,
                                      setup.op);
    if (all[0] > 0) shards->give_back_state();
    faults.at(Point::kEndGather, step());
    // The script gets its model whole where every member has the room (each by its own memory limit, as it
    // stands now); else it stays sharded, and the end checkpoint is the model.
    std::array<double, 1> apart{room_for_whole_model() ? 0.0 : 1.0};
    fabric().backend().allreduce_sync(comm::Buffer::of(std::span<double>(apart)), comm::ReduceOp::kMax,
                                      setup.op);
    kept_sharded = apart[0] > 0;
    if (kept_sharded && fabric().rank() == 0) {
      if (cfg.checkpoint_dir.empty())
        spdlog::error(
            "the trained model stays sharded over the ranks: it does not fit a rank whole, and with no "
            "--checkpoint-dir it is kept nowhere else; give one to keep it");
      else
        spdlog::warn(
            "the trained model stays sharded over the ranks (it does not fit a rank whole); it is the "
            "end checkpoint in {}",
            cfg.checkpoint_dir);
    }
    if (!kept_sharded) {
      // In pieces of 4 MiB: an all-gather of the whole buffer at once would take a temporary of its size in
      // the MPI library beside the model that is being made whole.
      constexpr std::size_t kPiece = std::size_t{1} << 20;
      const std::size_t n = work.params().size();
      std::vector<Slice> pieces;
      for (std::size_t o = 0; o < n; o += kPiece) pieces.push_back({o, std::min(kPiece, n - o)});
      const auto t = Clock::now();
      shards->gather_ranges(fabric().backend(), work.params(), pieces, setup.op);
      gather_ms += ms_since(t);
    }
    ended = true;
  }

  // ---- evaluation --------------------------------------------------------------------------------------

  std::pair<std::size_t, std::size_t> begin_evaluation(std::size_t n) {
    auto& f = fabric();
    // Evaluate the group's one model. n, the test set's size, is the same on every rank: with none there is
    // nothing to evaluate, and a consensus of a large model on a slow link takes a minute.
    if (n > 0) {
      gather_shards();
      f.algorithm().consensus();
      // The ranks' models are one now: the node's copy of the state (lockstep algorithms keep it every step).
      if (!f.algorithm().lockstep()) state.mirror();
    }
    const auto r = static_cast<std::size_t>(f.rank());
    const auto w = static_cast<std::size_t>(f.size());
    return {n * r / w, n * (r + 1) / w};
  }

  void end_evaluation(const workload::EvalSums& s, std::size_t count) {
    auto& f = fabric();
    double sums[3] = {s.loss, static_cast<double>(s.correct), static_cast<double>(count)};
    f.backend().allreduce_sync(comm::Buffer::of(std::span<double>(sums)), comm::ReduceOp::kSum, setup.op);
    const bool tested = sums[2] > 0;  // no test set: no accuracy to report
    const double test_loss = sums[0] / std::max(sums[2], 1.0);
    const double test_acc = sums[1] / std::max(sums[2], 1.0);
    if (tested) {
      sum.test_accuracy = test_acc;
      sum.test_loss = test_loss;
      events.emit(EvalEvent{sampler.epoch(), step(), f.size(), test_acc, test_loss});
    }
    mark_evaluated(tested, test_acc, test_loss);
  }

  void mark_evaluated(bool tested = false, double test_acc = 0, double test_loss = 0) {
    auto& f = fabric();
    sum.epochs = static_cast<int>(sampler.epoch()) + 1;
    if (sampler.epoch_done()) {
      if (f.rank() == 0 && tested) {
        spdlog::info("epoch {} done: test accuracy {:.2f}% (loss {:.4f})", sampler.epoch() + 1,
                     100 * test_acc, test_loss);
      }
      state.pos().last_eval_epoch = sampler.epoch();
    } else {
      final_evaluated = true;
    }
  }

  // ---- one step ----------------------------------------------------------------------------------------

  /// Steps left at the current size: the rest of this epoch, then whole epochs (for progress and ETA).
  [[nodiscard]] std::int64_t steps_remaining() {
    const auto g = static_cast<double>(lr.step_batch(fabric().size()));
    const auto n = static_cast<double>(parts.train_size);
    const double rest = std::ceil(static_cast<double>(parts.train_size - sampler.cursor()) / g);
    std::int64_t left =
        static_cast<std::int64_t>(rest) + static_cast<std::int64_t>(std::ceil(n / g)) *
                                              std::max<std::int64_t>(0, cfg.epochs - 1 - sampler.epoch());
    if (cfg.max_steps > 0) left = std::min(left, cfg.max_steps - step());
    return left;
  }

  workload::Teacher teacher(std::span<const std::size_t> indices) {
    double wait_ms = 0;
    std::int64_t missing = 0;
    auto t = teacher_feed.take(indices, plan.step, wait_ms, missing);
    metrics.teacher_wait(wait_ms, missing);
    return t;
  }

  const StepPlan& begin_step() {
    auto& f = fabric();
    const int rank = f.rank(), world = f.size();
    step_start = Clock::now();
    gather_shards();  // the last update's parameters (--shard optimizer)
    plan.step = step() + 1;
    plan.epoch = sampler.epoch();
    const std::size_t micro = static_cast<std::size_t>(world) * cfg.batch_size;
    plan.total = std::min(lr.step_batch(world), parts.train_size - sampler.cursor());
    plan.micro_batches = (plan.total + micro - 1) / micro;
    plan.lr = lr.lr(state.position());
    teacher_feed.prefetch(sampler, parts.train_size, rank, world, plan.total, micro);
    reducer.begin(plan.step, f.bucketer());
    f.algorithm().begin_step(plan.step);
    plan.reduces_gradients = f.algorithm().reduces_gradients(plan.step);
    return plan;
  }

  std::span<const std::size_t> micro_batch(std::size_t j) {
    SINEW_ENFORCE(j < plan.micro_batches, "micro-batch {} of a step of {}", j, plan.micro_batches);
    auto& f = fabric();
    const std::size_t micro = static_cast<std::size_t>(f.size()) * cfg.batch_size;
    const std::size_t offset = j * micro;
    batch = sampler.peek_range(f.rank(), f.size(), offset, std::min(micro, plan.total - offset));
    audit.record(generation, group.epoch(), plan.step, sampler.epoch(), batch.indices);
    if (j == 0 && !batch.indices.empty()) faults.at(Point::kForward, plan.step);
    return batch.indices;
  }

  void grad_ready(Slice r, CUevent_st* e) {
    if (plan.reduces_gradients) reducer.ready(r, e);
  }

  void reduce() {
    if (plan.reduces_gradients) reducer.finish();
    SINEW_ENFORCE(prefetched.empty(),
                  "{} prefetched gathers of parameters were not waited for before the step's reduction ended",
                  prefetched.size());
  }

  /// A recovery: the prefetches still pending are of the failed group.
  void cancel_prefetches() {
    for (const auto& p : prefetched) fabric().bucketer().cancel_in_order(p.posted);
    prefetched.clear();
  }

  std::optional<std::vector<std::size_t>> peek(std::size_t ahead) {
    auto& f = fabric();
    const std::size_t remaining = parts.train_size - sampler.cursor();
    const std::size_t global = lr.step_batch(f.size());
    const std::size_t off = ahead * global;
    if (off >= remaining) return std::nullopt;
    const std::size_t total = std::min(global, remaining - off);
    const std::size_t micro = static_cast<std::size_t>(f.size()) * cfg.batch_size;
    const auto b = sampler.peek_range(f.rank(), f.size(), off, std::min(micro, total));
    return std::vector<std::size_t>(b.indices.begin(), b.indices.end());
  }

  std::optional<float> reported_lr;  // report_lr(): a script's optimizer's

  void end_step(double local_loss) {
    auto& f = fabric();
    const std::int64_t next = plan.step;
    double comm_ms = std::exchange(gather_ms, 0.0);
    if (plan.reduces_gradients) {
      reducer.finish();
      comm_ms += reducer.comm_ms();
    }
    // The model's buffers (BatchNorm's running statistics) are rank 0's everywhere, as DDP's. Before the
    // update: with a sharded optimiser state the update is the step's last act, so that a member either
    // completed the step (its shards and its position) or did not (train/shards.hpp's recovery).
    if (const NamedSpans buffers = work.buffers(); !buffers.empty()) {
      work.buffers_to_host();
      for (const auto& [name, buf] : buffers) f.backend().broadcast_sync(comm::Buffer::of(buf), 0, setup.op);
      work.buffers_to_device();
    }
    // Without a gradient reduction the algorithm communicates in its step (qadam) or after it: the peers
    // are about to enter that exchange.
    if (!plan.reduces_gradients) faults.at(Point::kAllreduce, next);
    faults.at(Point::kOptimizer, next);
    f.algorithm().step(next, plan.lr);
    const auto ta = Clock::now();
    f.algorithm().after_step(next);
    if (!plan.reduces_gradients) comm_ms += ms_since(ta);
    sampler.advance(plan.total);
    state.pos().step = next;
    status::process().set_step(next);  // the step of this process's later status records
    // --shard optimizer/gradients: the model whole again now, not before the next step, so that whatever
    // runs between steps (a script's evaluation, torch.save(model.state_dict()) at an epoch's end) reads the
    // updated parameters, as under DDP. After the position: a failure here leaves the step completed, as a
    // failure in the next step's first collective would.
    gather_shards();
    comm_ms += std::exchange(gather_ms, 0.0);
    // Completed everywhere (a lockstep step includes every rank's gradients): the node's copy of the state.
    if (f.algorithm().lockstep()) state.mirror();
    const double step_ms = ms_since(step_start);
    teacher_feed.step_done(step_ms);
    const double recovery_ms =
        metrics.step_done({next, static_cast<std::int64_t>(plan.total), step_ms, comm_ms, local_loss,
                           f.take_bytes_sent() + (shards ? shards->take_bytes_sent() : 0)});
    if (recovery_ms >= 0 && f.rank() == 0)
      spdlog::info("recovered: first step done {:.1f} ms after the failure was detected", recovery_ms);
    if (metrics.window_due(next, sampler.epoch_done())) {
      metrics.report(
          f.backend(), setup.op,
          {step(), sampler.epoch(), cfg.epochs, f.size(), f.rank(),
           reported_lr ? *reported_lr * plan.lr : plan.lr,  // (plan.lr: then --lr-scaling's factor)
           f.bucketer().last_exposed_ms(), steps_remaining()},
          teacher_feed.active());
    }
  }

  // ---- step boundaries: signals, leave requests, job-server resizes, checkpoints ----------------------

  After boundary() {
    if (cfg.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cfg.step_sleep_ms));
    const After a = at_boundary();
    if (a != After::kContinue) {
      // A stop: its checkpoint was taken synchronously; one still in the background is committed first.
      if (a == After::kStop) checkpoints.progress(fabric());
      ended = true;
      end = a;
    }
    return a;
  }

  After at_boundary() {
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

  // ---- the run -----------------------------------------------------------------------------------------

  StartEvent start_event() {
    auto& f = fabric();
    StartEvent e;
    e.world_size = f.size();
    e.model = cfg.model;
    e.dataset = cfg.dataset;
    e.params = work.params().size();
    e.batch_size = cfg.batch_size;
    e.global_batch = lr.step_batch(f.size());
    e.steps = step() + steps_remaining();
    e.buckets = f.bucketer().num_buckets();
    e.elastic = name_of(kElasticNames, cfg.elastic);
    e.spares = group.spares();
    e.mpi = mpi::library_version();
    e.ulfm = mpi::ulfm_enabled();
    return e;
  }

  bool start() {
    // The launcher's record of this process (core/status.hpp), members, spares and replacements alike.
    if (step() > 0) status::process().set_step(step());
    status::process().start();
    if (group.spare()) {
      // Waits without a core until the members reform the pool. Dismissed at the end: it never trained,
      // and leaves like a member that left on request.
      const auto how = group.wait_as_spare();
      if (!how) {
        ended = true;
        end = After::kLeft;
        return false;
      }
      spdlog::info("hot spare (launch rank {}) promoted to rank {} of {}", group.launch_rank(), group.rank(),
                   group.size());
      elastic.join_promoted(*how);
      lr.build_schedule(state.pos());
    }
    metrics.started(start_event(), work.describe(), parts.train_size,
                    fabric().rank() == 0 && group.role() == membership::Role::kInitial);
    return true;
  }

  void recover(const CommFailure& e) {
    const bool inplace = cfg.elastic == ElasticMode::kInplace && mpi::ulfm_enabled();
    if (!inplace) {
      if (cfg.elastic == ElasticMode::kOff) {
        // The failure itself, with its type (a Timeout stays one) when called from its handler.
        if (std::current_exception()) std::rethrow_exception(std::current_exception());
        throw e;
      }
      // Restart mode (asked for, or no usable ULFM): the supervisor relaunches from the checkpoint. It
      // sizes the relaunch by the survivors that say so in their status records.
      status::process().relaunch(status::Reason::kFailure, e.message());
      SINEW_THROW(RelaunchRequest, "{}; exiting for a relaunch from the latest checkpoint (--elastic {})",
                  e.message(), name_of(kElasticNames, cfg.elastic));
    }
    ++sum.failures;
    cancel_prefetches();
    const RecoveryReport rep = elastic.recover(e);
    metrics.recovering(rep.detected, {rep.world_size, group.epoch(), 0, 0, 0});
    final_evaluated = false;  // a replacement evaluates with the others: all do it again
    if (rep.world_size < cfg.min_ranks) {
      sum.below_min_ranks = true;
      if (fabric().rank() == 0) {
        spdlog::error("only {} ranks left, below --min-ranks {}: checkpointing step {} and stopping",
                      rep.world_size, cfg.min_ranks, step());
      }
      checkpoints.save(fabric(), "min-ranks");
      ended = true;
    }
  }

  Summary finish() {
    sum.checkpoint_error = checkpoints.error();
    // Trained to the end: the node's copy of the state has served its purpose (a stop leaves it: its
    // checkpoint is as new, and a relaunch compares the two).
    // The complete record is the launcher's sign (mpi_scripts/sinew-run) that the job has its result,
    // whatever its exit code; the line is for people.
    if (ended && end == After::kContinue && !sum.below_min_ranks && sum.stopped_by_signal == 0) {
      state.drop_mirror();
      if (fabric().rank() == 0) {
        status::process().complete(fabric().size());
        // Not through the log: --log-level must not hide it.
        fmt::print(stderr, "[sinew] job complete: trained to the end at step {}\n", step());
      }
    }
    if (end != After::kLeft) group.dismiss_spares();  // training is over: the idle spares leave
    if (end == After::kLeft) {
      sum.left = true;
      return sum;
    }
    // A stop with exit code 75 (Summary::exit_code): the launcher relaunches at the same size.
    if (sum.below_min_ranks) {
      status::process().relaunch(status::Reason::kMinRanks, fmt::format("{} ranks left, below --min-ranks {}",
                                                                        fabric().size(), cfg.min_ranks));
    } else if (sum.stopped_by_signal != 0) {
      status::process().relaunch(status::Reason::kStopSignal,
                                 fmt::format("signal {}", sum.stopped_by_signal));
    }
    metrics.done(step(), fabric().size(), fabric().algorithm().name());
    teacher_feed.totals(sum, fabric().rank() == 0);
    events.emit(sum);
    return sum;
  }
};

Session::Session(Config config, membership::Group group, workload::Workload& work, SessionParts parts)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(group), work, std::move(parts))) {}
Session::~Session() = default;
bool Session::start() { return impl_->start(); }
Next Session::next() { return impl_->next(); }
const StepPlan& Session::begin_step() { return impl_->begin_step(); }
std::span<const std::size_t> Session::micro_batch(std::size_t j) { return impl_->micro_batch(j); }
void Session::grad_ready(Slice range) { impl_->grad_ready(range, nullptr); }
void Session::grad_ready(Slice range, CUevent_st* ready) { impl_->grad_ready(range, ready); }
void Session::end_step(double local_loss) { impl_->end_step(local_loss); }
void Session::report_lr(float lr) { impl_->reported_lr = lr; }
void Session::reduce() { impl_->reduce(); }
std::vector<Slice> Session::sharded_gradients() const {
  if (impl_->shards && impl_->shards->gradients_sharded()) return impl_->shards->held_ranges();
  return {};
}
void Session::gather_params(std::span<const Slice> ranges, std::uint64_t ticket) {
  auto& i = *impl_;
  SINEW_ENFORCE(i.shards && i.shards->parameters_sharded(),
                "a gather of parameters without --shard parameters");
  const auto t = Clock::now();
  auto& f = i.fabric();
  if (ticket == 0) {
    f.bucketer().run_in_order(
        [&] { i.shards->gather_ranges(f.backend(), i.work.params(), ranges, i.setup.op); });
  } else {
    const auto it = std::find_if(i.prefetched.begin(), i.prefetched.end(),
                                 [&](const Impl::Prefetch& p) { return p.ticket == ticket; });
    SINEW_ENFORCE(it != i.prefetched.end() &&
                      std::equal(ranges.begin(), ranges.end(), it->ranges.begin(), it->ranges.end()),
                  "a wait for prefetch {} that is not pending or gathers other ranges", ticket);
    const auto posted = it->posted;
    i.prefetched.erase(it);
    f.bucketer().wait_in_order(posted);  // only what the prefetch did not hide counts
  }
  i.gather_ms += ms_since(t);
}
void Session::gather_rows(Slice table, std::size_t width, std::span<const std::int64_t> rows) {
  auto& i = *impl_;
  SINEW_ENFORCE(i.shards && i.shards->parameters_sharded(), "a gather of rows without --shard parameters");
  const auto t = Clock::now();
  auto& f = i.fabric();
  f.bucketer().run_in_order(
      [&] { i.shards->gather_rows(f.backend(), i.work.params(), table, width, rows, i.setup.op); });
  i.gather_ms += ms_since(t);
}
std::uint64_t Session::prefetch_params(std::span<const Slice> ranges) {
  auto& i = *impl_;
  SINEW_ENFORCE(i.shards && i.shards->parameters_sharded(),
                "a prefetch of parameters without --shard parameters");
  auto& f = i.fabric();
  Impl::Prefetch p{i.next_ticket++, {ranges.begin(), ranges.end()}, nullptr};
  // The task owns its ranges: the caller's may be gone when the communication thread runs it.
  p.posted = f.bucketer().post_in_order(
      [&i, &f, r = p.ranges] { i.shards->gather_ranges(f.backend(), i.work.params(), r, i.setup.op); });
  i.prefetched.push_back(std::move(p));
  return i.prefetched.back().ticket;
}
void Session::release_params(std::span<const Slice> ranges) {
  auto& i = *impl_;
  SINEW_ENFORCE(i.shards && i.shards->parameters_sharded(),
                "a release of parameters without --shard parameters");
  i.shards->release(i.work.params(), ranges);
}
bool Session::sharded_parameters() const { return impl_->shards && impl_->shards->parameters_sharded(); }
bool Session::kept_sharded() const noexcept { return impl_->kept_sharded; }
std::optional<std::vector<std::size_t>> Session::peek(std::size_t ahead) { return impl_->peek(ahead); }
std::string Session::share(const std::string& bytes, bool have) {
  return impl_->fabric().backend().share_sync(bytes, have, impl_->setup.op);
}
void Session::allreduce(std::span<double> values, bool max) {
  auto& f = impl_->fabric();
  f.backend().allreduce_sync(comm::Buffer::of(values), max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum,
                             impl_->setup.op);
}
std::int64_t Session::epoch() const { return impl_->sampler.epoch(); }
std::uint64_t Session::group_epoch() const { return impl_->group.epoch(); }
After Session::boundary() { return impl_->boundary(); }
std::pair<std::size_t, std::size_t> Session::begin_evaluation(std::size_t test_size) {
  return impl_->begin_evaluation(test_size);
}
void Session::end_evaluation(const workload::EvalSums& sums, std::size_t count) {
  impl_->end_evaluation(sums, count);
}
void Session::skip_evaluation() { impl_->mark_evaluated(); }
void Session::recover(const CommFailure& e) { impl_->recover(e); }
Summary Session::finish() { return impl_->finish(); }
void Session::fault(fault::Point p) { impl_->faults.at(p, impl_->plan.step); }
workload::Teacher Session::teacher(std::span<const std::size_t> indices) { return impl_->teacher(indices); }
const Config& Session::config() const noexcept { return impl_->cfg; }
int Session::rank() const { return impl_->group.rank(); }
int Session::size() const { return impl_->group.size(); }
std::int64_t Session::step() const { return impl_->step(); }
const membership::Group& Session::group() const { return impl_->group; }

}  // namespace sinew::train
