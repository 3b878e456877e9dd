// The session: Sinew's elastic runtime around one training job, as an API that a training loop drives.
//
// The built-in loop (trainer.hpp) is one driver; a caller that owns forward and backward itself (a test's
// own model, the PyTorch integration, where autograd decides when a gradient is ready and the user's script
// decides when to step) is another. Both talk to the workload's flat buffers through the same calls:
//
//   if (!s.start()) return s.finish();             // a hot spare waits here; false: dismissed
//   for (;;) {
//     try {
//       for (Next n = s.next(); n != Next::kDone; n = s.next()) {
//         if (n == Next::kEvaluate) { ... s.begin_evaluation() ... s.end_evaluation(sums); continue; }
//         const StepPlan& p = s.begin_step();       // the step's number, its samples, the lr
//         for (std::size_t j = 0; j < p.micro_batches; ++j) {
//           auto indices = s.micro_batch(j);        // this rank's samples (recorded for the audit)
//           ... forward; s.fault(Point::kBackward); backward, calling s.grad_ready(range) as ranges of
//               the workload's gradients become final (last micro-batch only) ...
//         }
//         s.end_step(local_loss);                   // reduction done, the update, metrics
//         if (s.boundary() != After::kContinue) break;  // agreement, signals, schedule, checkpoints
//       }
//       break;
//     } catch (const CommFailure& e) {
//       s.recover(e);                               // in place: shrink, state from memory, grow back
//     }
//   }
//   Summary sum = s.finish();                       // the end checkpoint, the done event
//
// A CommFailure can come out of any collective call (begin_step's algorithm hooks, grad_ready's
// reduction on the communication thread, end_step, boundary, the evaluation, next()'s end checkpoint):
// recover() then makes the state of the most advanced survivor everyone's, so the loop simply asks next()
// again and redoes the lost step. A replacement process is spawned with the group's SpawnCommand
// (membership::Group::attach): the command line the caller gives, e.g. `sys.executable` and `sys.argv`.
// It constructs its Session like the first launch did and takes its state from the survivors' memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/flat.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/summary.hpp"
#include "sinew/train/teacher_feed.hpp"
#include "sinew/workload/workload.hpp"

struct CUevent_st;

namespace sinew::comm::nccl {
class Api;
}

namespace sinew::train {

/// What the loop does next.
enum class Next : std::uint8_t {
  kStep,      ///< train a step (begin_step ... end_step, boundary)
  kEvaluate,  ///< evaluate the test set (begin_evaluation ... end_evaluation): an epoch ended, or the last
              ///< step
  kDone,      ///< nothing: the run is over (finish())
};

/// How a step boundary ended.
enum class After : std::uint8_t {
  kContinue,  ///< go on
  kStop,      ///< a stop signal: checkpointed, the run stops (next() says kDone)
  kLeft,      ///< this member left the group (on request, or the job server shrank it)
};

/// One optimiser step as the session planned it: every member trains the same step with its share.
struct StepPlan {
  std::int64_t step = 0;          ///< the step being trained, 1-based
  std::int64_t epoch = 0;         ///< the sampler's epoch
  std::size_t total = 0;          ///< the step's GLOBAL sample count: the loss's denominator
  std::size_t micro_batches = 1;  ///< micro-batches (> 1 with --global-batch: accumulate gradients)
  float lr = 0;                   ///< the learning rate of the update
  bool reduces_gradients = true;  ///< false: grad_ready() is not needed (the algorithm exchanges models)
};

/// What a session is built with besides the configuration, the group and the workload.
struct SessionParts {
  std::size_t train_size = 0;  ///< samples in the training set: the sampler's range
  /// One step's computation without communication, in ms, for --algorithm auto. Empty: auto is refused.
  std::function<double()> compute_ms;
  /// --distill-*: empty means distillation is refused.
  DistillerFactory distiller;
  /// A workload on a device: the NCCL entry points; null is the real library (tests: the fake NCCL).
  comm::nccl::Api* nccl_api = nullptr;
};

class Session {
 public:
  /// Builds the runtime over `group` (a hot spare, a spawned replacement or a first-launch member) for
  /// `work`, which must outlive the session. A first-launch member connects (collective), makes every
  /// member's parameters rank 0's, and resumes from a checkpoint if --resume asks for one; a spawned
  /// replacement takes its whole state from its peers' memory; a hot spare does nothing yet (start()).
  /// Throws InvalidArgument (bad configuration), CheckpointError (the requested checkpoint cannot be
  /// used), CommFailure/Timeout.
  Session(Config config, membership::Group group, workload::Workload& work, SessionParts parts);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  Session(Session&&) = delete;
  Session& operator=(Session&&) = delete;
  ~Session();

  /// A hot spare waits here, without a core, until the members promote it (true: it took their state
  /// and is a member now) or training ends (false: finish() says it left). Members return true at once.
  bool start();
  /// What to do next. May checkpoint (the end of the run): collective, may throw CommFailure.
  Next next();

  // ---- a step -----------------------------------------------------------------------------------------
  /// Plans the next step (its samples, the lr) and tells the algorithm it begins. Collective for some
  /// algorithms; may throw CommFailure.
  const StepPlan& begin_step();
  /// This rank's samples of micro-batch `j` (< micro_batches) of the step, recorded in the audit; valid
  /// until the next call. May be empty (the epoch's last step can leave a rank without samples): the
  /// rank then contributes zero gradients and still reports every range.
  std::span<const std::size_t> micro_batch(std::size_t j);
  /// A range of the workload's gradients (one of its ready_order()) is final for this step: its bucket
  /// is reduced on the communication thread as soon as the bucket is complete. Only in the step's last
  /// micro-batch, each range once. Throws InvalidArgument for a range the workload does not list.
  void grad_ready(Slice range);
  /// The same for gradients in device memory, final once `ready` (an event on the compute stream)
  /// completes.
  void grad_ready(Slice range, CUevent_st* ready);
  /// Ends the step: ranges never reported are zero-filled and reduced with --find-unused-parameters, or
  /// throw InvalidArgument naming them; waits for the reduction; the algorithm's update; the position
  /// advances; metrics. `local_loss` is this rank's share of the step's mean loss (NaN: not known, the
  /// metrics leave it out). May throw CommFailure.
  void end_step(double local_loss);
  /// The learning rate the metrics and the progress line report from now on, times the schedule's: a
  /// script's own optimizer's (the schedule's is then --lr-scaling's factor, which Sinew applies to it).
  void report_lr(float lr);
  /// For a caller whose backward is over before it steps (the Python package's own loop, where `.grad`
  /// must hold the reduced gradient when backward() returns): does end_step()'s first part now, the
  /// unreported ranges and the wait for the reduction; end_step() then skips it. Idempotent within a step.
  /// May throw CommFailure, and InvalidArgument as end_step().
  void reduce();
  /// This rank's samples of the step `ahead` steps after the next one (0: the next one), as planned at
  /// the current size from the current position (micro-batch 0; --global-batch aside); nothing when the
  /// epoch ends before it. What begin_step()/micro_batch(0) give if the group does not change.
  [[nodiscard]] std::optional<std::vector<std::size_t>> peek(std::size_t ahead);
  /// Collective: the `bytes` of the lowest rank whose `have` is true, on every member (empty if none has
  /// them). The Python package's state beside the flat buffers (a scheduler, counters) goes to a new
  /// member with it. May throw CommFailure.
  std::string share(const std::string& bytes, bool have);
  /// Collective sum (or, with `max`, maximum) of `values` over the group, in place. May throw CommFailure.
  void allreduce(std::span<double> values, bool max);
  /// --shard gradients: the ranges of the flat buffer whose reduced gradients this rank holds after a
  /// reduction, its own shard first (the others are its replicas'); the rest of the gradients are NaN.
  /// Empty where the gradients are whole (every other stage).
  [[nodiscard]] std::vector<Slice> sharded_gradients() const;
  /// --shard parameters (ZeRO-3): whether the parameters are sharded; then a unit's forward and backward
  /// need gather_params() of its ranges first (collective, in the same order on every rank, between the
  /// gradient buckets' reductions where backward calls it) and release_params() after (local).
  [[nodiscard]] bool sharded_parameters() const;
  /// --shard parameters: training ended and the model was not gathered whole (Config::whole_at_end false on
  /// a member): each member holds its shards only, the end checkpoint the whole model.
  [[nodiscard]] bool kept_sharded() const noexcept;
  /// With `ticket` from prefetch_params() of the same ranges, waits for that gather instead (rethrowing its
  /// failure).
  void gather_params(std::span<const Slice> ranges, std::uint64_t ticket = 0);
  /// The prefetch (--shard-prefetch): gather_params() of the unit that runs next, handed to the
  /// communication thread without waiting for it, so that it overlaps the running unit's compute. A
  /// collective, in the same order on every rank as gather_params(); returns the ticket for
  /// gather_params(). Every prefetch is waited for by gather_params() before the step's reduction ends; a
  /// recovery cancels those still pending.
  std::uint64_t prefetch_params(std::span<const Slice> ranges);
  /// An embedding unit's forward: of `table` (its weight's range, rows of `width` elements) only the rows
  /// this rank's indices name (`rows`, sorted and distinct; each rank its own), in the unit's place among the
  /// collectives as gather_params() (ShardedOptimizer::gather_rows).
  void gather_rows(Slice table, std::size_t width, std::span<const std::int64_t> rows);
  void release_params(std::span<const Slice> ranges);
  /// The group's epoch: it changes with every change of membership.
  [[nodiscard]] std::uint64_t group_epoch() const;
  /// The step boundary: every few steps the group agrees on signals, leave requests, the job server's
  /// schedule and checkpoints, and carries them out. May throw CommFailure.
  After boundary();

  // ---- evaluation -------------------------------------------------------------------------------------
  /// Makes the group's models one (relaxed algorithms) and returns this rank's contiguous shard
  /// [first, second) of a test set of `test_size` samples. Collective.
  std::pair<std::size_t, std::size_t> begin_evaluation(std::size_t test_size);
  /// The shard's sums; reduced over the group and reported (metrics, log, summary). Collective.
  void end_evaluation(const workload::EvalSums& sums, std::size_t count);

  /// An evaluation the caller makes itself (the script's own loop evaluates in its own code): the epoch
  /// counts as evaluated, with no collective and nothing reported.
  void skip_evaluation();

  // ---- failures and the end ---------------------------------------------------------------------------
  /// After a CommFailure out of any call above: recovers in place (--elastic inplace under ULFM), else
  /// throws RelaunchRequest (restart mode) or rethrows (--elastic off). Below --min-ranks it checkpoints
  /// and the run ends (next() says kDone).
  void recover(const CommFailure& e);
  /// The end: the idle spares are dismissed, and (unless this member left) the done event is written.
  Summary finish();

  /// Test seam: an injected fault (--inject-fault) of point `p` in the step being trained fires here.
  void fault(fault::Point p);
  /// Distillation: the teacher's targets for `indices` (this rank's micro-batch), counted and logged.
  workload::Teacher teacher(std::span<const std::size_t> indices);

  [[nodiscard]] const Config& config() const noexcept;
  /// This process's rank and the group's size in the current view (they change when the group does).
  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  /// Optimiser steps completed by the group.
  [[nodiscard]] std::int64_t step() const;
  /// The sampler's epoch (0-based): the one being trained, or the one just finished until next() moves on.
  [[nodiscard]] std::int64_t epoch() const;
  [[nodiscard]] const membership::Group& group() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::train
