#include "teacher_commands.hpp"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/distill/sources.hpp"
#include "sinew/distill/teacher_model.hpp"
#include "sinew/serve/autoscaler.hpp"
#include "sinew/serve/etcd.hpp"
#include "sinew/serve/service_source.hpp"
#include "sinew/serve/teacher_client.hpp"
#include "sinew/serve/teacher_server.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace sinew::apps {

namespace {

/// Parses argv with `desc`; prints the help and returns false for --help.
bool parse(int argc, char** argv, const po::options_description& desc, const char* command) {
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help") != 0) {
      std::cout << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "sinew-teacher {}: {}; see sinew-teacher {} --help", command, e.what(),
                command);
  }
  return true;
}

/// "1,2,3" (one core per slot) or "0-1;2-3" (';' between slots whose lists have commas or ranges).
std::vector<std::string> parse_cpus(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  const char sep = s.find(';') != std::string::npos ? ';' : ',';
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (item.empty() || item.find_first_not_of("0123456789,-") != std::string::npos) {
      SINEW_THROW(InvalidArgument, "--cpus: '{}' is not a CPU list (e.g. 1,2,3 or 0-1;2-3)", s);
    }
    out.push_back(item);
  }
  return out;
}

}  // namespace

int precompute_main(int argc, char** argv) {
  std::string checkpoint, out, data_dir, log_level = "info";
  po::options_description desc(
      "usage: sinew-teacher precompute --checkpoint P --out FILE [options]\n\n"
      "Computes the teacher's logits of every training sample into an HDF5 table for\n"
      "`sinew-train --distill-table FILE` (no service needed; valid while the data are not augmented).\n\n"
      "options");
  desc.add_options()("help,h", "this help")("checkpoint", po::value(&checkpoint)->required(),
                                            "a committed checkpoint or a checkpoint root (its newest)")(
      "out", po::value(&out)->required(), "the table to write (written whole, then renamed into place)")(
      "data-dir", po::value(&data_dir), "the data set's directory (default: the checkpoint's run's)")(
      "log-level", po::value(&log_level)->default_value(log_level), "trace | debug | info | warn | error");
  if (!parse(argc, argv, desc, "precompute")) return 0;
  log::init(0, 1, log::parse_level(log_level));
  auto options = distill::TeacherModel::dataset_options(checkpoint);
  if (!data_dir.empty()) options.data_dir = data_dir;
  const auto split = data::load_dataset(options);
  const auto t0 = std::chrono::steady_clock::now();
  const auto n = distill::write_logit_table(checkpoint, split.train, out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("wrote logits of %llu samples to %s in %.1f s\n", static_cast<unsigned long long>(n),
              out.c_str(), s);
  return 0;
}

int autoscale_main(int argc, char** argv) {
  serve::AutoscaleOptions o;
  std::string checkpoint, token_file, data_dir, cpus, log_level = "info";
  po::options_description desc(
      "usage: sinew-teacher autoscale --checkpoint P --registry URL --job J [options]\n\n"
      "Starts and stops teachers (sinew-teacher serve of the checkpoint) to keep the students' wait for\n"
      "logits under --target-wait with as few teachers as it can. Runs until SIGTERM or SIGINT (or\n"
      "--duration), then stops the teachers it started. docs/distillation.md.\n\n"
      "options");
  desc.add_options()("help,h", "this help")("checkpoint", po::value(&checkpoint)->required(),
                                            "the teachers' checkpoint (or checkpoint root)")(
      "registry", po::value(&o.registry)->required(), "etcd endpoint (http://host:port)")(
      "job", po::value(&o.job)->required(), "the job: registry prefix /sinew/JOB/")(
      "token-file", po::value(&token_file),
      "the job token, passed on to the teachers (default: SINEW_JOB_TOKEN)")("data-dir", po::value(&data_dir),
                                                                             "passed on to the teachers")(
      "cpus", po::value(&cpus),
      "CPU lists, one per teacher slot, for taskset: 1,2,3 or 0-1;2-3 (default: not pinned)")(
      "min-teachers", po::value(&o.min_teachers)->default_value(o.min_teachers), "never fewer")(
      "max-teachers", po::value(&o.max_teachers)->default_value(o.max_teachers),
      "never more (at most the slots of --cpus)")(
      "target-wait", po::value(&o.target_wait_fraction)->default_value(o.target_wait_fraction),
      "the students' wait for logits as a fraction of their step time, to stay under")(
      "interval", po::value(&o.interval_s)->default_value(o.interval_s), "seconds between observations")(
      "cooldown", po::value(&o.cooldown_s)->default_value(o.cooldown_s),
      "seconds without a change after one")(
      "events", po::value(&o.events),
      "JSON Lines of observations and decisions (hpc/bench/plot_autoscale.py)")(
      "duration", po::value(&o.duration_s)->default_value(o.duration_s),
      "stop after this many seconds (0: never)")("log-level", po::value(&log_level)->default_value(log_level),
                                                 "trace | debug | info | warn | error");
  if (!parse(argc, argv, desc, "autoscale")) return 0;
  log::init(0, 1, log::parse_level(log_level));
  o.cpus = parse_cpus(cpus);
  std::error_code ec;
  const auto self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) SINEW_THROW(InternalError, "cannot find this program (/proc/self/exe): {}", ec.message());
  o.teacher_command = {self.string(), "serve", "--checkpoint", checkpoint,    "--registry",
                       o.registry,    "--job", o.job,          "--log-level", log_level};
  if (!token_file.empty()) o.teacher_command.insert(o.teacher_command.end(), {"--token-file", token_file});
  if (!data_dir.empty()) o.teacher_command.insert(o.teacher_command.end(), {"--data-dir", data_dir});

  // As in serve: SIGTERM and SIGINT go to a thread of their own (the autoscaler's children get the default
  // dispositions back).
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGUSR2);  // from main: run() ended by itself
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  serve::Autoscaler scaler(o);
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop, &sig);
    if (sig == SIGUSR2) return;
    spdlog::info("autoscaler: signal {}: stopping", sig);
    scaler.stop();
  });
  try {
    scaler.run();
  } catch (...) {
    pthread_kill(watcher.native_handle(), SIGUSR2);
    watcher.join();
    throw;
  }
  pthread_kill(watcher.native_handle(), SIGUSR2);
  watcher.join();
  return 0;
}

struct TeacherRegistration::Impl {
  serve::TeacherServer& server;
  std::unique_ptr<serve::Registration> reg;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread refresher;

  explicit Impl(serve::TeacherServer& s) : server(s) {}

  [[nodiscard]] std::string value() const {
    const auto i = server.info();
    return nlohmann::json{{"id", i.id},
                          {"address", i.address},
                          {"model", i.model},
                          {"classes", i.classes},
                          {"dataset", i.dataset},
                          {"train_size", i.train_size},
                          {"samples_per_s", i.samples_per_s},
                          {"max_request_samples", i.max_request_samples},
                          {"step", i.checkpoint_step},
                          {"requests", i.requests},
                          {"pid", static_cast<long>(::getpid())}}
        .dump();
  }
};

TeacherRegistration::TeacherRegistration(const std::string& registry, const std::string& job,
                                         serve::TeacherServer& server, int ttl_s)
    : impl_(std::make_unique<Impl>(server)) {
  const auto info = server.info();
  impl_->reg = std::make_unique<serve::Registration>(registry, serve::teachers_prefix(job) + info.id,
                                                     impl_->value(), ttl_s);
  spdlog::info("registered as {} in {}", serve::teachers_prefix(job) + info.id, registry);
  // The value carries the measured throughput (the students' balancer weighs teachers by it).
  impl_->refresher = std::thread([this] {
    std::unique_lock lock(impl_->mu);
    while (!impl_->cv.wait_for(lock, std::chrono::seconds(1), [this] { return impl_->stop; })) {
      lock.unlock();
      impl_->reg->update(impl_->value());
      lock.lock();
    }
  });
}

TeacherRegistration::~TeacherRegistration() {
  {
    const std::lock_guard lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->refresher.join();
  impl_->reg.reset();  // revokes the lease: students drop this teacher now, not when it expires
}

}  // namespace sinew::apps
