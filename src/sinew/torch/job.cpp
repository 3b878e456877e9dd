#include "sinew/torch/job.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/torch/workload.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/session.hpp"

namespace sinew::pytorch {

namespace {
constexpr std::chrono::milliseconds kFinalizeBound{5000};
}

struct Job::Impl {
  std::string help;
  train::Config cfg;
  std::optional<mpi::Environment> env;
  std::optional<membership::Group> group;
  std::unique_ptr<train::Session> session;
  TorchWorkload* work = nullptr;
  Steps steps;
  // next()'s place in the session's loop
  train::StepPlan plan;
  bool in_step = false;    // begin_step() done, end_step() not yet
  bool computing = false;  // a micro-batch was handed out; its loss comes with the next call
  bool done = false;
  std::size_t j = 0;        // the micro-batch of the step
  std::size_t samples = 0;  // in the micro-batch handed out
  double step_loss = 0;
  // the caller's own loop
  int phase = 0;               // 0 no step open, 1 begun, 2 reduced
  bool boundary_due = false;   // a step was updated; its boundary comes at the next settle()
  bool settled = false;        // settle() said "a step" and begin() has not yet come
  std::exception_ptr failure;  // a CommFailure the gradient hooks saw (rethrown by reduce())
};

Job::Job(const std::vector<std::string>& options, std::vector<std::string> command)
    : impl_(std::make_unique<Impl>()) {
  std::vector<const char*> args = {command.empty() ? "sinew" : command[0].c_str()};
  for (const std::string& o : options) args.push_back(o.c_str());
  auto parsed = train::parse_command_line(static_cast<int>(args.size()), args.data());
  if (!parsed.config) {
    impl_->help = parsed.text;
    return;
  }
  impl_->cfg = *parsed.config;
  // As sinew-train (apps/sinew_train.cpp): a dead peer's socket must not kill this process.
  std::signal(SIGPIPE, SIG_IGN);
  // The command as given: /proc/self/exe would name the interpreter behind a virtual environment's
  // python link, and the replacement would not see the environment's packages.
  membership::SpawnCommand spawn;
  if (command.empty() || command[0].empty() || command[0][0] != '/') {
    // A program by a relative name (C++'s argv[0]): this executable's absolute path, so that the
    // runtime's daemons find it whatever their working directory.
    spawn = membership::SpawnCommand::of_this_process(0, nullptr);
    if (!command.empty()) spawn.args.assign(command.begin() + 1, command.end());
  } else {
    spawn.program = command[0];
    spawn.args.assign(command.begin() + 1, command.end());
  }
  membership::JoinDeadline join_deadline;
  int argc = 0;
  char** no_argv = nullptr;
  try {
    impl_->env.emplace(&argc, &no_argv);
  } catch (const CommFailure& e) {
    if (!join_deadline.spawned()) throw;
    std::fprintf(stderr, "[sinew] spawned process: %s; leaving\n", e.message().c_str());
    membership::JoinDeadline::leave();
  }
  try {
    impl_->group.emplace(membership::Group::attach(std::move(spawn), impl_->cfg.spares));
  } catch (const membership::JoinFailed& e) {
    std::fprintf(stderr, "[sinew] spawned process: %s; leaving (exit code 0)\n", e.message().c_str());
    impl_->env->finalize(0, kFinalizeBound);
    std::exit(0);  // NOLINT(concurrency-mt-unsafe): no thread of Sinew's runs yet in a process never a member
  }
  join_deadline.joined();
  auto& group = *impl_->group;
  group.watch(std::chrono::milliseconds(impl_->cfg.stall_timeout_ms));
  log::init(group.rank(), group.size(), log::parse_level(impl_->cfg.log_level));
  if (group.role() == membership::Role::kRecovered)
    spdlog::info("spawned as rank {} of {} to replace failed ranks", group.rank(), group.size());
}

Job::~Job() = default;

const std::string& Job::help() const noexcept { return impl_->help; }
const train::Config& Job::config() const noexcept { return impl_->cfg; }
optim::OptimizerOptions Job::optimizer() const { return train::optimizer_options(impl_->cfg); }
data::DataSplit Job::dataset() const { return data::load_dataset(train::dataset_options(impl_->cfg)); }
int Job::rank() const {
  if (impl_->session) return impl_->session->rank();
  return impl_->group ? impl_->group->rank() : 0;
}
int Job::size() const {
  if (impl_->session) return impl_->session->size();
  return impl_->group ? impl_->group->size() : 1;
}
train::Session* Job::session() noexcept { return impl_->session.get(); }

bool Job::start(TorchWorkload& work, std::size_t train_size, const Steps& steps) {
  if (!impl_->group || impl_->session)
    SINEW_THROW(InvalidArgument, "Job: {}",
                impl_->session ? "a job trains once" : "the job was asked for --help");
  impl_->work = &work;
  impl_->steps = steps;
  train::SessionParts parts;
  parts.train_size = train_size;
  const auto first_samples = [this, train_size] {
    std::vector<std::size_t> idx(std::min<std::size_t>(impl_->cfg.batch_size, train_size));
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    return idx;
  };
  // The buckets follow backward's order: one pass on the first samples finds it (the same pass on every
  // member, a replacement's too, so the layouts agree; the state sync's checksum covers the layout).
  if (steps.train && train_size > 0) {
    const auto t = std::chrono::steady_clock::now();
    const std::vector<std::size_t> idx = first_samples();
    const std::size_t moved = work.probe_ready_order([&] { (void)impl_->steps.train(idx); });
    if (impl_->group->rank() == 0 && impl_->group->role() == membership::Role::kInitial) {
      spdlog::info(
          "bucket order: backward's, from one pass ({} of {} tensors moved from the module's order; "
          "{:.0f} ms)",
          moved, work.num_params(),
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
    }
  }
  // --algorithm auto weighs communication against one step's computation: the caller's step on this rank's
  // batch size of the first samples, median of 3, the hooks disarmed (nothing is reduced or kept).
  if (steps.train)
    parts.compute_ms = [this, first_samples] {
      TorchWorkload& w = *impl_->work;
      const std::vector<std::size_t> idx = first_samples();
      std::vector<double> ms;
      for (int i = 0; i < 3; ++i) {
        w.begin_micro_batch(0, 2, idx.size(), idx.size());  // not the last micro-batch: no reports
        const auto t = std::chrono::steady_clock::now();
        (void)impl_->steps.train(idx);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count());
      }
      w.begin_micro_batch(0, 2, 0, 1);  // zero gradients again
      w.disarm();
      std::sort(ms.begin(), ms.end());
      return ms[1];
    };
  impl_->session =
      std::make_unique<train::Session>(impl_->cfg, std::move(*impl_->group), work, std::move(parts));
  impl_->group.reset();
  train::Session& s = *impl_->session;
  if (work.on_device()) {
    work.set_device_ready([&s](Slice r, CUevent_st* ready) { s.grad_ready(r, ready); });
  } else {
    work.set_ready([&s](Slice r) { s.grad_ready(r); });
  }
  work.set_first_ready([&s] { s.fault(fault::Point::kBackward); });
  impl_->done = !s.start();  // a hot spare waits here; false: dismissed at the end
  work.keep_buffers();
  return !impl_->done;
}

std::optional<MicroBatch> Job::next(double loss) {
  train::Session* s = impl_->session.get();
  if (s == nullptr) SINEW_THROW(InvalidArgument, "Job::next before Job::start");
  Impl& m = *impl_;
  TorchWorkload& work = *m.work;
  if (m.computing) {  // the micro-batch handed out last: this rank's share of the step's mean loss
    m.step_loss += loss * static_cast<double>(m.samples) / static_cast<double>(m.plan.total);
    m.computing = false;
    ++m.j;
  }
  while (!m.done) {
    if (m.in_step && m.j < m.plan.micro_batches) {
      const auto indices = s->micro_batch(m.j);
      work.begin_micro_batch(m.j, m.plan.micro_batches, indices.size(), m.plan.total);
      if (indices.empty()) {
        work.skip_micro_batch();
        ++m.j;
        continue;
      }
      m.computing = true;
      m.samples = indices.size();
      return MicroBatch{indices, m.j, m.plan.micro_batches, m.plan.step, m.plan.epoch};
    }
    if (m.in_step) {
      m.in_step = false;
      work.disarm();
      s->end_step(m.step_loss);
      work.keep_buffers();
      if (s->boundary() != train::After::kContinue) m.done = true;
      continue;
    }
    const train::Next n = s->next();
    if (n == train::Next::kDone) {
      m.done = true;
    } else if (n == train::Next::kEvaluate) {
      const auto& ev = m.steps.evaluate;
      const auto [first, last] = s->begin_evaluation(ev ? m.steps.test_size : 0);
      const workload::EvalSums sums = ev && last > first ? ev(first, last) : workload::EvalSums{};
      s->end_evaluation(sums, last - first);
    } else {
      m.plan = s->begin_step();
      m.in_step = true;
      m.j = 0;
      m.step_loss = 0;
    }
  }
  return std::nullopt;
}

void Job::recover(const CommFailure& e) {
  if (!impl_->session) throw e;
  Impl& m = *impl_;
  m.in_step = false;  // the lost step is planned again
  m.computing = false;
  m.phase = 0;
  m.boundary_due = false;
  m.settled = false;
  m.failure = nullptr;
  m.work->disarm();
  // The lost step's forward passes updated BatchNorm's statistics here: back to the last completed step's,
  // so that the redo counts its batch once (the state sync then takes the most advanced member's).
  m.work->restore_buffers();
  m.session->recover(e);
  m.work->keep_buffers();
}

bool Job::start_loop(TorchWorkload& work, std::size_t train_size, std::size_t batch_size, int epochs,
                     bool shuffle) {
  if (batch_size == 0 || epochs <= 0)
    SINEW_THROW(InvalidArgument, "a batch size of {} and {} epochs: both must be at least 1", batch_size,
                epochs);
  impl_->cfg.batch_size = batch_size;
  impl_->cfg.epochs = epochs;
  impl_->cfg.shuffle = shuffle;
  // The learning rate is the script's optimizer's (and its scheduler's): Sinew's update multiplies it by the
  // session's lr, which is then --lr-scaling's factor alone (1 until a resize).
  impl_->cfg.lr = 1;
  impl_->cfg.lr_schedule = "constant";
  impl_->cfg.warmup_steps = 0;
  impl_->cfg.dataset = "the script's data";
  impl_->cfg.model = "pytorch";
  Steps none;
  if (!start(work, train_size, none)) return false;
  Impl& m = *impl_;
  train::Session& s = *m.session;
  // The hooks run inside the script's backward(): a failure they see is kept for reduce(), which the
  // package calls when backward is over, instead of leaving backward() as an error of autograd's.
  if (work.on_device()) {
    work.set_device_ready([&m, &s](Slice r, CUevent_st* ready) {
      try {
        s.grad_ready(r, ready);
      } catch (const CommFailure&) {
        if (!m.failure) m.failure = std::current_exception();
      }
    });
  } else {
    work.set_ready([&m, &s](Slice r) {
      try {
        s.grad_ready(r);
      } catch (const CommFailure&) {
        if (!m.failure) m.failure = std::current_exception();
      }
    });
  }
  return true;
}

bool Job::settle() {
  Impl& m = *impl_;
  train::Session* s = m.session.get();
  if (s == nullptr) SINEW_THROW(InvalidArgument, "Job::settle before Job::start_loop");
  if (m.settled) return true;
  if (m.done) return false;
  if (m.phase != 0) update(0);  // the script updated by hand (or not at all: reduce() says so)
  if (m.boundary_due) {
    m.boundary_due = false;
    if (s->boundary() != train::After::kContinue) m.done = true;
  }
  while (!m.done) {
    const train::Next n = s->next();
    if (n == train::Next::kDone) {
      m.done = true;
    } else if (n == train::Next::kEvaluate) {
      // The script evaluates in its own loop: nothing collective here, so that a replacement that joins
      // while the others evaluate (job.all_reduce) meets them there.
      s->skip_evaluation();
    } else {
      m.settled = true;
      return true;
    }
  }
  return false;
}

MicroBatch Job::begin() {
  Impl& m = *impl_;
  if (!settle()) SINEW_THROW(InvalidArgument, "Job::begin: the run is over");
  train::Session& s = *m.session;
  m.plan = s.begin_step();
  if (m.plan.micro_batches != 1) {
    SINEW_THROW(InvalidArgument,
                "--global-batch {} gives steps of {} micro-batches; in the script's own loop every batch of "
                "its DataLoader is one step: leave --global-batch out (accumulate gradients by hand: sum the "
                "losses of several batches, then call backward() once)",
                m.cfg.global_batch, m.plan.micro_batches);
  }
  m.settled = false;
  m.failure = nullptr;
  const auto indices = s.micro_batch(0);
  m.work->begin_micro_batch(0, 1, std::max<std::size_t>(indices.size(), 1), m.plan.total);
  if (indices.empty()) m.work->mute();  // runs the step on a stand-in sample that weighs nothing
  m.phase = 1;
  return MicroBatch{indices, 0, 1, m.plan.step, m.plan.epoch};
}

void Job::reduce() {
  Impl& m = *impl_;
  if (m.phase == 0) SINEW_THROW(InvalidArgument, "Job::reduce outside a step");
  if (m.failure) std::rethrow_exception(std::exchange(m.failure, nullptr));
  m.session->reduce();
  m.phase = 2;
}

void Job::update(double loss) {
  Impl& m = *impl_;
  if (m.phase == 1) reduce();
  if (m.phase != 2) SINEW_THROW(InvalidArgument, "Job::update outside a step");
  m.work->disarm();
  m.session->end_step(loss);
  m.work->keep_buffers();
  m.phase = 0;
  m.boundary_due = true;
}

int Job::phase() const noexcept { return impl_->phase; }

std::optional<std::vector<std::size_t>> Job::peek(std::size_t ahead) {
  if (!impl_->session) SINEW_THROW(InvalidArgument, "Job::peek before Job::start_loop");
  return impl_->session->peek(ahead);
}

train::Summary Job::finish() {
  if (!impl_->session) SINEW_THROW(InvalidArgument, "Job::finish before Job::start");
  impl_->work->set_ready({});
  impl_->work->set_device_ready({});
  impl_->work->set_first_ready({});
  return impl_->session->finish();
}

train::Summary Job::run(TorchWorkload& work, std::size_t train_size, const Steps& steps) {
  if (!steps.train) SINEW_THROW(InvalidArgument, "Job::run: no training step was given");
  if (!start(work, train_size, steps)) return finish();
  double loss = 0;
  for (;;) {
    try {
      const auto batch = next(loss);
      if (!batch) break;
      loss = steps.train(batch->indices);
    } catch (const CommFailure& e) {
      recover(e);
      loss = 0;
    }
  }
  return finish();
}

int Job::exit(int code) {
  impl_->session.reset();  // metrics, audit and checkpoints written and closed
  if (impl_->env) impl_->env->finalize(code, kFinalizeBound);
  impl_->env.reset();
  return code;
}

}  // namespace sinew::pytorch
