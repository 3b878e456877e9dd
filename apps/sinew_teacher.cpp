// sinew-teacher: the teacher side of distillation (docs/distillation.md).
//
//   sinew-teacher serve --checkpoint P [options]   serve a checkpoint's logits over gRPC (teacher.proto)
//   sinew-teacher autoscale ...                     start and stop teachers as the students need them
//   sinew-teacher precompute --checkpoint P --out F a table of every training sample's logits
//
// Subcommands are entries of kCommands below: each parses its own arguments (argv[0] is its name). None
// runs under mpirun or initialises MPI (autoscale and precompute are in teacher_commands.cpp).
//
// Exit codes (docs/usage.md): 0 stopped by SIGTERM/SIGINT (or --help); 2 usage error (unknown subcommand,
// bad option, no job token); 3 data missing or unreadable; 4 checkpoint missing or unusable; 6 the service
// could not start (cannot listen).
#include <pthread.h>
#include <unistd.h>
#include <boost/program_options.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/serve/teacher_server.hpp"
#include "teacher_commands.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace sinew;

namespace {

/// The job token: the first line of --token-file (surrounding whitespace dropped), else SINEW_JOB_TOKEN.
std::string read_token(const std::string& file) {
  std::string token;
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) SINEW_THROW(InvalidArgument, "--token-file {}: cannot read it", file);
    std::getline(in, token);
  } else {
    // Read before any thread starts.
    const char* env = std::getenv("SINEW_JOB_TOKEN");  // NOLINT(concurrency-mt-unsafe)
    if (env != nullptr) token = env;
  }
  const auto first = token.find_first_not_of(" \t\r\n");
  const auto last = token.find_last_not_of(" \t\r\n");
  token = first == std::string::npos ? std::string() : token.substr(first, last - first + 1);
  if (token.empty()) {
    SINEW_THROW(
        InvalidArgument,
        "no job token: {}; teacher and students share one (e.g. from `openssl rand -hex 16`)",
        file.empty() ? "give --token-file F or set SINEW_JOB_TOKEN" : "--token-file " + file + " is empty");
  }
  return token;
}

/// Writes `text` to `path` so that a reader sees all of it or no file: a temporary file, then a rename.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) SINEW_THROW(InvalidArgument, "--ready-file {}: cannot write {}", path, tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    SINEW_THROW(InvalidArgument, "--ready-file {}: cannot rename {} to it: {}", path, tmp, ec.message());
  }
}

int serve_main(int argc, char** argv) {
  serve::ServeOptions o;
  std::string token_file, ready_file, log_level = "info";
  po::options_description desc(
      "usage: sinew-teacher serve --checkpoint P [options]\n\n"
      "Serves the logits of a checkpoint's model over gRPC until SIGTERM or SIGINT. Prints\n"
      "\"serving MODEL (step S) on ADDRESS\" on stdout once it serves. Plaintext gRPC, for a trusted\n"
      "cluster network; the job token keeps other jobs' students out by mistake, not attackers.\n\n"
      "options");
  desc.add_options()("help,h", "this help")(
      "checkpoint", po::value(&o.checkpoint)->required(),
      "a committed checkpoint (ckpt-NNNNNNNNNN) or a checkpoint root: its newest committed checkpoint")(
      "listen", po::value(&o.listen)->default_value(o.listen),
      "HOST:PORT to listen on; port 0: any free port")(
      "token-file", po::value(&token_file), "file holding the job token (default: env SINEW_JOB_TOKEN)")(
      "data-dir", po::value(&o.data_dir), "the data set's directory (default: the checkpoint's run's)")(
      "max-request-samples", po::value(&o.max_request_samples)->default_value(o.max_request_samples),
      "refuse requests of more samples")(
      "max-batch", po::value(&o.max_batch)->default_value(o.max_batch),
      "merge concurrent requests into forward passes of up to this many samples")(
      "ready-file", po::value(&ready_file), "once serving, write the address into this file (atomically)")(
      "log-level", po::value(&log_level)->default_value(log_level), "trace | debug | info | warn | error");
  std::string registry, job;
  desc.add_options()("registry", po::value(&registry),
                     "register in this etcd (http://host:port) under a lease, for students to discover")(
      "job", po::value(&job), "the job to register under (/sinew/JOB/teachers/); required with --registry");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    if (vm.count("help") != 0) {
      std::cout << desc << "\n";
      return 0;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "sinew-teacher serve: {}; see sinew-teacher serve --help", e.what());
  }
  log::init(0, 1, log::parse_level(log_level));
  o.token = read_token(token_file);
  if (registry.empty() != job.empty())
    SINEW_THROW(InvalidArgument, "sinew-teacher serve: --registry and --job go together");
  if (job.find_first_of("/ \t") != std::string::npos)
    SINEW_THROW(InvalidArgument, "--job must be a name without '/' or spaces, got '{}'", job);

  // SIGTERM and SIGINT are taken by a thread of their own (sigwait), never by a handler: blocked here,
  // before any thread starts, so that every thread (gRPC's too) inherits the mask. One that comes while the
  // model loads waits, and stops the teacher as soon as it serves.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a student gone mid-reply is gRPC's business, not a reason to die

  serve::TeacherServer server(o);
  std::optional<apps::TeacherRegistration> registration;
  if (!registry.empty()) registration.emplace(registry, job, server);
  const auto info = server.info();
  if (!ready_file.empty()) write_atomically(ready_file, server.address() + "\n");
  std::printf("serving %s (step %lld) on %s\n", info.model.c_str(),
              static_cast<long long>(info.checkpoint_step), server.address().c_str());
  std::fflush(stdout);

  std::thread watcher([&] {
    int sig = 0;
    sigwait(&stop, &sig);
    spdlog::info("teacher: signal {}: shutting down", sig);
    server.shutdown();
  });
  server.wait();
  watcher.join();
  registration.reset();  // revoke the lease: students stop asking this teacher now
  return 0;
}

/// A subcommand: its name, one line for the usage, and its main (argv[0] is the subcommand's name).
struct Command {
  std::string_view name;
  std::string_view summary;
  int (*main)(int argc, char** argv);
};

// The subcommands.
constexpr Command kCommands[] = {
    {"serve", "serve a checkpoint's logits to students (gRPC), registered in the job's registry", serve_main},
    {"autoscale", "start and stop teachers to keep the students' wait for logits under a target",
     apps::autoscale_main},
    {"precompute", "write a table of the logits of every training sample (sinew-train --distill-table)",
     apps::precompute_main},
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: sinew-teacher COMMAND [OPTIONS]   (sinew-teacher COMMAND --help: its options)\n\n"
               "The teachers of Sinew's elastic distillation.\n\ncommands:\n");
  for (const auto& c : kCommands) {
    std::fprintf(to, "  %-12.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view cmd = argc > 1 ? argv[1] : "";
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (c.name == cmd) return apps::guarded_main([&] { return c.main(argc - 1, argv + 1); }, /*mpi=*/false);
  }
  if (cmd.empty()) {
    std::fprintf(stderr, "sinew-teacher: error: no command given\n");
  } else {
    std::fprintf(stderr, "sinew-teacher: error: unknown command '%.*s'\n", static_cast<int>(cmd.size()),
                 cmd.data());
  }
  usage(stderr);
  return static_cast<int>(ExitCode::kUsage);
}
