#include "sinew/train/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/core/fault.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/distill/distiller.hpp"
#include "sinew/distill/sources.hpp"
#include "sinew/train/driver.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/session.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

using fault::Point;

namespace {

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
  return std::make_unique<distill::Distiller>(distill_options(c), std::move(source), train.size());
}

}  // namespace

struct Trainer::Impl {
  Config cfg;
  data::DataSplit data;
  std::unique_ptr<workload::Workload> work;
  Session session;

  Impl(Config c, membership::Group group, const WorkloadFactory& make, const distill::ServiceFactory& service)
      : cfg(std::move(c)),
        data(data::load_dataset(dataset_options(cfg))),
        work(make(model_spec(cfg), data)),
        session(cfg, std::move(group), *work, parts(service)) {}

  SessionParts parts(const distill::ServiceFactory& service) {
    SessionParts p;
    p.train_size = data.train.size();
    p.compute_ms = [this] { return probe_compute_ms(); };
    p.distiller = [this, service](int launch_rank, std::function<std::pair<int, int>()> place) {
      return make_distiller(cfg, data.train, service, launch_rank, std::move(place));
    };
    return p;
  }

  /// One step's forward and backward on this rank's batch, without communication (median of 3, ms): what
  /// `--algorithm auto` weighs communication against. Leaves the parameters untouched.
  double probe_compute_ms() {
    std::vector<std::size_t> idx(std::min(cfg.batch_size, data.train.size()));
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    return median_ms(3, [&] { work->train({idx, static_cast<double>(idx.size()), false}, {}); });
  }

  /// Test-set loss and accuracy of this rank's shard [first, last), in chunks.
  workload::EvalSums evaluate(std::size_t first, std::size_t last) {
    constexpr std::size_t kChunk = 1024;
    std::vector<std::size_t> idx;
    workload::EvalSums sums;
    for (std::size_t s = first; s < last; s += kChunk) {
      idx.resize(std::min(kChunk, last - s));
      for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = s + i;
      const auto chunk = work->evaluate(idx);
      sums.loss += chunk.loss;
      sums.correct += chunk.correct;
    }
    return sums;
  }

  /// One micro-batch of a step (several with --global-batch, accumulated by the workload): forward,
  /// backward with buckets reduced as they fill in the last one; returns this rank's loss share.
  double train(const Task& t) {
    workload::TrainHooks hooks;
    if (t.micro_batch == 0) hooks.before_backward = [this] { session.fault(Point::kBackward); };
    if (distilling(cfg)) hooks.teacher = [this, &t] { return session.teacher(t.indices); };
    if (t.last_micro_batch() && work->on_device()) {
      hooks.device_ready = [this](Slice r, CUevent_st* e) { session.grad_ready(r, e); };
    } else if (t.last_micro_batch()) {
      hooks.ready = [this](Slice r) { session.grad_ready(r); };
    }
    return work->train({t.indices, static_cast<double>(t.total), t.micro_batch > 0}, hooks);
  }

  Summary run() {
    Driver d(session, data.test.size());
    return d.run([this](const Task& t) { return train(t); },
                 [this](std::size_t first, std::size_t last) { return evaluate(first, last); });
  }
};

Trainer::Trainer(Config config, const mpi::Communicator& comm, const WorkloadFactory& make,
                 const distill::ServiceFactory& service)
    : impl_(std::make_unique<Impl>(std::move(config), membership::Group::over(comm), make, service)) {}
Trainer::Trainer(Config config, membership::Group group, const WorkloadFactory& make,
                 const distill::ServiceFactory& service)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(group), make, service)) {}
Trainer::~Trainer() = default;
Summary Trainer::run() { return impl_->run(); }
workload::Workload& Trainer::workload() { return *impl_->work; }
int Trainer::rank() const { return impl_->session.rank(); }

}  // namespace sinew::train
