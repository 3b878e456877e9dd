// The one loop that drives a Session (session.hpp), written once. Pull-style: the caller asks for the next
// task (a micro-batch to train, a test-set shard to evaluate, or the end), does it, and asks again; a
// CommFailure out of any call goes to recover(), after which next() plans the lost step again. run() is that
// loop for a caller that hands over its training and evaluation as functions:
//
//   Driver d(session, test_size);
//   Summary sum = d.run(train_micro_batch, evaluate);   // or: start(), next()/evaluated()/recover(),
//   finish()
//
// sinew-train's built-in loop (trainer.hpp), the libtorch job and the Python package's job.run
// (torch/job.hpp) and the tests use it. A script that owns its loop (the Python package's DDP-style loop:
// every batch of its DataLoader is one step) drives the same object through settle(), begin(), reduce() and
// update() instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "sinew/core/error.hpp"
#include "sinew/train/session.hpp"
#include "sinew/train/summary.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

/// What the loop does now.
struct Task {
  enum class Kind : std::uint8_t {
    kMicroBatch,  ///< train `indices` (forward, backward; the gradients' ranges to the session in the last)
    kEvaluate,    ///< evaluate the test samples [first, last), then evaluated()
    kDone,        ///< the run is over: finish()
  };
  Kind kind = Kind::kDone;
  std::span<const std::size_t> indices;  ///< this rank's samples (may be empty); valid until the next call
  std::size_t micro_batch = 0, micro_batches = 1;
  std::int64_t step = 0, epoch = 0;
  std::size_t total = 0;            ///< the step's GLOBAL sample count: the loss's denominator
  std::size_t first = 0, last = 0;  ///< kEvaluate: this rank's shard of the test set
  [[nodiscard]] bool last_micro_batch() const noexcept { return micro_batch + 1 == micro_batches; }
};

/// What the driver tells the workload around the session's calls (each optional).
struct DriverHooks {
  std::function<void()> step_ends;   ///< before the update (the gradient hooks are done for the step)
  std::function<void()> step_ended;  ///< after it, and after a recovery: the state to roll back to
  std::function<void()> recovering;  ///< before an in-place recovery: back to that state
};

class Driver {
 public:
  /// `test_size`: samples in the test set (0: nothing to evaluate).
  Driver(Session& session, std::size_t test_size, DriverHooks hooks = {});

  /// A hot spare waits here until it is promoted (true) or dismissed at the end (false: finish()).
  bool start();
  /// The next task; `loss` is this rank's share of the step's mean loss over the micro-batch handed out
  /// last (ignored after an evaluation or a recovery). May throw CommFailure.
  Task next(double loss = 0);
  /// The sums of the evaluation task handed out last (collective).
  void evaluated(const workload::EvalSums& sums);
  /// After a CommFailure out of any call: recovered in place (Session::recover), the lost step planned again.
  void recover(const CommFailure& e);
  /// The end: the summary (Session::finish).
  Summary finish();
  /// The whole loop: start (unless started), the tasks until done (`train` returns the micro-batch's loss
  /// share; `evaluate` the sums of a shard), failures recovered, finish.
  Summary run(const std::function<double(const Task&)>& train,
              const std::function<workload::EvalSums(std::size_t first, std::size_t last)>& evaluate);

  // ---- the caller's own loop: every batch is one step of one micro-batch --------------------------------
  /// Carries out what is due between steps (the last step's update if the caller updated by hand, the
  /// boundary; evaluations are the caller's own and skipped) and says whether a step follows. Idempotent
  /// until begin(). May throw CommFailure.
  bool settle();
  /// The step's samples (settle() first). InvalidArgument with --global-batch (several micro-batches).
  Task begin();
  /// The step's gradient reduction, once backward is over (Session::reduce). May throw CommFailure.
  void reduce();
  /// The update with the reduced gradients (reduce() first if not yet). May throw CommFailure.
  void update(double loss);
  /// 0 between steps, 1 begun, 2 reduced.
  [[nodiscard]] int phase() const noexcept { return phase_; }

  [[nodiscard]] Session& session() noexcept { return s_; }

 private:
  void call(const std::function<void()>& f) const {
    if (f) f();
  }
  Task micro_batch_task();

  Session& s_;
  std::size_t test_size_;
  DriverHooks hooks_;
  StepPlan plan_;
  bool started_ = false;
  bool done_ = false;
  // next(): the step being handed out micro-batch by micro-batch
  bool in_step_ = false;
  bool computing_ = false;  // a micro-batch was handed out; its loss comes with the next call
  std::size_t j_ = 0;
  double step_loss_ = 0;
  std::pair<std::size_t, std::size_t> shard_;  // the evaluation handed out
  // the caller's own loop
  int phase_ = 0;
  bool boundary_due_ = false;  // a step was updated; its boundary comes at the next settle()
  bool settled_ = false;       // settle() said "a step" and begin() has not come yet
};

}  // namespace sinew::train
