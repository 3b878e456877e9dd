#include "sinew/train/driver.hpp"

namespace sinew::train {

Driver::Driver(Session& session, std::size_t test_size, DriverHooks hooks)
    : s_(session), test_size_(test_size), hooks_(std::move(hooks)) {}

bool Driver::start() {
  started_ = true;
  done_ = !s_.start();
  if (!done_) call(hooks_.step_ended);
  return !done_;
}

Task Driver::micro_batch_task() {
  Task t;
  t.kind = Task::Kind::kMicroBatch;
  t.indices = s_.micro_batch(j_);
  t.micro_batch = j_;
  t.micro_batches = plan_.micro_batches;
  t.step = plan_.step;
  t.epoch = plan_.epoch;
  t.total = plan_.total;
  return t;
}

Task Driver::next(double loss) {
  if (computing_) {  // the micro-batch handed out last
    step_loss_ += loss;
    computing_ = false;
    ++j_;
  }
  while (!done_) {
    if (in_step_ && j_ < plan_.micro_batches) {
      computing_ = true;
      return micro_batch_task();
    }
    if (in_step_) {
      in_step_ = false;
      call(hooks_.step_ends);
      s_.end_step(step_loss_);
      call(hooks_.step_ended);
      if (s_.boundary() != After::kContinue) done_ = true;
      continue;
    }
    const Next n = s_.next();
    if (n == Next::kDone) {
      done_ = true;
    } else if (n == Next::kEvaluate) {
      shard_ = s_.begin_evaluation(test_size_);
      Task t;
      t.kind = Task::Kind::kEvaluate;
      t.first = shard_.first;
      t.last = shard_.second;
      t.epoch = s_.epoch();
      t.step = s_.step();
      return t;
    } else {
      plan_ = s_.begin_step();
      in_step_ = true;
      j_ = 0;
      step_loss_ = 0;
    }
  }
  return {};
}

void Driver::evaluated(const workload::EvalSums& sums) {
  s_.end_evaluation(sums, shard_.second - shard_.first);
}

void Driver::recover(const CommFailure& e) {
  in_step_ = false;  // the lost step is planned again
  computing_ = false;
  phase_ = 0;
  boundary_due_ = false;
  settled_ = false;
  call(hooks_.recovering);
  s_.recover(e);
  call(hooks_.step_ended);
}

Summary Driver::finish() {
  done_ = true;
  return s_.finish();
}

Summary Driver::run(const std::function<double(const Task&)>& train,
                    const std::function<workload::EvalSums(std::size_t, std::size_t)>& evaluate) {
  if (!started_ && !start()) return finish();  // a hot spare, dismissed at the end
  if (done_) return finish();
  double loss = 0;
  for (;;) {
    try {
      const Task t = next(loss);
      loss = 0;
      if (t.kind == Task::Kind::kDone) break;
      if (t.kind == Task::Kind::kEvaluate) {
        evaluated(t.last > t.first ? evaluate(t.first, t.last) : workload::EvalSums{});
        continue;
      }
      loss = train(t);
    } catch (const CommFailure& e) {
      recover(e);
      loss = 0;
    }
  }
  return finish();
}

bool Driver::settle() {
  if (settled_) return true;
  if (done_) return false;
  if (phase_ != 0) update(0);  // the caller updated by hand (or not at all: reduce() says so)
  if (boundary_due_) {
    boundary_due_ = false;
    if (s_.boundary() != After::kContinue) done_ = true;
  }
  while (!done_) {
    const Next n = s_.next();
    if (n == Next::kDone) {
      done_ = true;
    } else if (n == Next::kEvaluate) {
      // The caller evaluates in its own loop: nothing collective here, so that a replacement that joins
      // while the others evaluate (their own all-reduce) meets them there.
      s_.skip_evaluation();
    } else {
      settled_ = true;
      return true;
    }
  }
  return false;
}

Task Driver::begin() {
  if (!settle()) SINEW_THROW(InvalidArgument, "the run is over: no step begins");
  plan_ = s_.begin_step();
  if (plan_.micro_batches != 1) {
    SINEW_THROW(
        InvalidArgument,
        "--global-batch {} gives steps of {} micro-batches; in the script's own loop every batch of its "
        "DataLoader is one step: leave --global-batch out (accumulate gradients by hand: sum the losses "
        "of several batches, then call backward() once)",
        s_.config().global_batch, plan_.micro_batches);
  }
  settled_ = false;
  j_ = 0;
  phase_ = 1;
  return micro_batch_task();
}

void Driver::reduce() {
  if (phase_ == 0) SINEW_THROW(InvalidArgument, "a gradient reduction outside a step");
  s_.reduce();
  phase_ = 2;
}

void Driver::update(double loss) {
  if (phase_ == 1) reduce();
  if (phase_ != 2) SINEW_THROW(InvalidArgument, "an update outside a step");
  call(hooks_.step_ends);
  s_.end_step(loss);
  call(hooks_.step_ended);
  phase_ = 0;
  boundary_due_ = true;
}

}  // namespace sinew::train
