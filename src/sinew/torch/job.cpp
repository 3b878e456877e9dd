#include "sinew/torch/job.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/torch/workload.hpp"
#include "sinew/train/driver.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/process.hpp"
#include "sinew/train/session.hpp"

namespace sinew::pytorch {

struct Job::Impl {
  std::string help;
  train::Config cfg;
  std::optional<train::Process> process;
  std::unique_ptr<train::Session> session;
  std::unique_ptr<train::Driver> driver;
  TorchWorkload* work = nullptr;
  Steps steps;
  bool done = false;           // a hot spare dismissed at the end
  double share = 0;            // the micro-batch handed out last: its loss as a share of the step's mean
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
  int argc = 0;
  char** no_argv = nullptr;
  impl_->process.emplace(impl_->cfg, std::move(spawn), &argc, &no_argv);
  // Spawned, never a member: the parents recovered without it.
  if (!impl_->process->joined()) std::exit(0);  // NOLINT(concurrency-mt-unsafe): no thread of Sinew's runs
}

Job::~Job() = default;

const std::string& Job::help() const noexcept { return impl_->help; }
const train::Config& Job::config() const noexcept { return impl_->cfg; }
bool Job::kept_sharded() const { return impl_->session && impl_->session->kept_sharded(); }
void Job::keep_sharded_at_end() {
  SINEW_ENFORCE(!impl_->session, "the end's gather chosen after training started");
  impl_->cfg.whole_at_end = false;
}
optim::OptimizerOptions Job::optimizer() const { return train::optimizer_options(impl_->cfg); }
data::DataSplit Job::dataset() const { return data::load_dataset(train::dataset_options(impl_->cfg)); }
int Job::rank() const {
  if (impl_->session) return impl_->session->rank();
  return impl_->process && impl_->process->joined() ? impl_->process->group().rank() : 0;
}
int Job::size() const {
  if (impl_->session) return impl_->session->size();
  return impl_->process && impl_->process->joined() ? impl_->process->group().size() : 1;
}
train::Session* Job::session() noexcept { return impl_->session.get(); }

bool Job::start(TorchWorkload& work, std::size_t train_size, const Steps& steps) {
  if (!impl_->process || !impl_->process->joined() || impl_->session)
    SINEW_THROW(InvalidArgument, "Job: {}",
                impl_->session ? "a job trains once" : "the job was asked for --help");
  impl_->work = &work;
  impl_->steps = steps;
  // --shard optimizer for a C++ caller's workload (the Python package's is told at its construction).
  if (impl_->cfg.shard != train::ShardStage::kNone && work.has_optimizer()) work.shard_state();
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
    if (rank() == 0 && impl_->process->group().role() == membership::Role::kInitial) {
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
      const double ms = median_ms(3, [&] {
        w.begin_micro_batch(0, 2, idx.size(), idx.size());  // not the last micro-batch: no reports
        (void)impl_->steps.train(idx);
      });
      w.begin_micro_batch(0, 2, 0, 1);  // zero gradients again
      w.disarm();
      return ms;
    };
  impl_->session =
      std::make_unique<train::Session>(impl_->cfg, impl_->process->take_group(), work, std::move(parts));
  train::Session& s = *impl_->session;
  if (work.on_device()) {
    work.set_device_ready([&s](Slice r, CUevent_st* ready) { s.grad_ready(r, ready); });
  } else {
    work.set_ready([&s](Slice r) { s.grad_ready(r); });
  }
  work.set_first_ready([&s] { s.fault(fault::Point::kBackward); });
  train::DriverHooks hooks;
  hooks.step_ends = [&work] { work.disarm(); };
  hooks.step_ended = [&work] { work.keep_buffers(); };
  // The lost step's forward passes updated BatchNorm's statistics here: back to the last completed step's,
  // so that the redo counts its batch once (the state sync then takes the most advanced member's).
  hooks.recovering = [this, &work] {
    impl_->failure = nullptr;
    work.disarm();
    work.restore_buffers();
  };
  impl_->driver = std::make_unique<train::Driver>(s, steps.evaluate ? steps.test_size : 0, std::move(hooks));
  impl_->done = !impl_->driver->start();  // a hot spare waits here; false: dismissed at the end
  return !impl_->done;
}

std::optional<MicroBatch> Job::next(double loss) {
  if (!impl_->driver) SINEW_THROW(InvalidArgument, "Job::next before Job::start");
  Impl& m = *impl_;
  TorchWorkload& work = *m.work;
  double share = std::exchange(m.share, 0) * loss;
  while (!m.done) {
    const train::Task t = m.driver->next(share);
    share = 0;
    if (t.kind == train::Task::Kind::kDone) break;
    if (t.kind == train::Task::Kind::kEvaluate) {
      m.driver->evaluated(t.last > t.first ? m.steps.evaluate(t.first, t.last) : workload::EvalSums{});
      continue;
    }
    work.begin_micro_batch(t.micro_batch, t.micro_batches, t.indices.size(), t.total);
    if (t.indices.empty()) {
      work.skip_micro_batch();
      continue;
    }
    m.share = static_cast<double>(t.indices.size()) / static_cast<double>(t.total);
    return MicroBatch{t.indices, t.micro_batch, t.micro_batches, t.step, t.epoch};
  }
  return std::nullopt;
}

void Job::recover(const CommFailure& e) {
  if (!impl_->driver) throw e;
  impl_->share = 0;
  impl_->driver->recover(e);
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
  if (!impl_->driver) SINEW_THROW(InvalidArgument, "Job::settle before Job::start_loop");
  return impl_->driver->settle();
}

MicroBatch Job::begin() {
  Impl& m = *impl_;
  if (!m.driver) SINEW_THROW(InvalidArgument, "Job::begin before Job::start_loop");
  const train::Task t = m.driver->begin();
  m.failure = nullptr;
  m.work->begin_micro_batch(0, 1, std::max<std::size_t>(t.indices.size(), 1), t.total);
  if (t.indices.empty()) m.work->mute();  // runs the step on a stand-in sample that weighs nothing
  return MicroBatch{t.indices, 0, 1, t.step, t.epoch};
}

void Job::reduce() {
  Impl& m = *impl_;
  if (phase() == 0) SINEW_THROW(InvalidArgument, "Job::reduce outside a step");
  if (m.failure) std::rethrow_exception(std::exchange(m.failure, nullptr));
  m.driver->reduce();
}

std::vector<Slice> Job::sharded_gradients() const {
  return impl_->session ? impl_->session->sharded_gradients() : std::vector<Slice>{};
}
bool Job::sharded_parameters() const { return impl_->session && impl_->session->sharded_parameters(); }
void Job::gather_params(const std::vector<Slice>& ranges, std::uint64_t ticket) {
  SINEW_ENFORCE(impl_->session, "a gather of parameters before training started");
  impl_->session->gather_params(ranges, ticket);
}
void Job::gather_rows(Slice table, std::size_t width, const std::vector<std::int64_t>& rows) {
  SINEW_ENFORCE(impl_->session, "a gather of rows before training started");
  impl_->session->gather_rows(table, width, rows);
}
std::uint64_t Job::prefetch_params(const std::vector<Slice>& ranges) {
  SINEW_ENFORCE(impl_->session, "a prefetch of parameters before training started");
  return impl_->session->prefetch_params(ranges);
}
void Job::release_params(const std::vector<Slice>& ranges) {
  SINEW_ENFORCE(impl_->session, "a release of parameters before training started");
  impl_->session->release_params(ranges);
}

void Job::update(double loss, double lr) {
  if (!impl_->driver) SINEW_THROW(InvalidArgument, "Job::update outside a step");
  if (!std::isnan(lr)) impl_->session->report_lr(static_cast<float>(lr));
  if (impl_->driver->phase() == 1) reduce();
  impl_->driver->update(loss);
}

int Job::phase() const noexcept { return impl_->driver ? impl_->driver->phase() : 0; }

std::optional<std::vector<std::size_t>> Job::peek(std::size_t ahead) {
  if (!impl_->session) SINEW_THROW(InvalidArgument, "Job::peek before Job::start_loop");
  return impl_->session->peek(ahead);
}

train::Summary Job::finish() {
  if (!impl_->driver) SINEW_THROW(InvalidArgument, "Job::finish before Job::start");
  impl_->work->set_ready({});
  impl_->work->set_device_ready({});
  impl_->work->set_first_ready({});
  return impl_->driver->finish();
}

train::Summary Job::run(TorchWorkload& work, std::size_t train_size, const Steps& steps) {
  if (!steps.train) SINEW_THROW(InvalidArgument, "Job::run: no training step was given");
  if (!start(work, train_size, steps)) return finish();
  impl_->driver->run(
      [&](const train::Task& t) {
        work.begin_micro_batch(t.micro_batch, t.micro_batches, t.indices.size(), t.total);
        if (t.indices.empty()) {
          work.skip_micro_batch();
          return 0.0;
        }
        // The step's loss is the mean over its micro-batches' samples.
        return steps.train(t.indices) * static_cast<double>(t.indices.size()) / static_cast<double>(t.total);
      },
      steps.evaluate);
  return finish();
}

int Job::exit(int code) {
  impl_->driver.reset();
  impl_->session.reset();  // metrics, audit and checkpoints written and closed
  return impl_->process ? impl_->process->finalize(code) : code;
}

}  // namespace sinew::pytorch
