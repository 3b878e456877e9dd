// A training job that drives a train::Session from outside Sinew's loop, as the PyTorch integration will:
// the program owns its model (test_support::LinearModel), computes forward and backward itself, hands
// gradient ranges to the session as they become final, and lets the session do the rest (sampling, the
// reduction, the update, boundaries, checkpoints, recovery). Replacements are spawned with this program's
// own command line (membership::SpawnCommand::of_this_process).
//
// Usage: mpirun -n N session-driver [sinew-train options] [--driver-out FILE] [--driver-unused]
//   --driver-out FILE   rank 0 writes the final parameters there as one JSON line ({"params": [...]})
//   --driver-unused     the model has a parameter block that never gets a gradient
// The sinew-train options that make sense here: --epochs, --batch-size, --lr, --lr-schedule, --metrics,
// --audit-dir, --inject-fault, --find-unused-parameters, --checkpoint-*, --timeout-ms, --elastic, ...
// Exit codes as sinew-train's (0 done, 2 usage, 5 an unrecovered failure, ...).
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "../support/drive_session.hpp"
#include "../support/flat_workload.hpp"
#include "../support/linear_model.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/session.hpp"

using namespace sinew;

namespace {

constexpr std::size_t kTrain = 512;
constexpr std::size_t kTestFirst = 100000;  // the test samples' indices: kTestFirst + [0, kTest)
constexpr std::size_t kTest = 256;
constexpr std::chrono::milliseconds kFinalizeBound{5000};

int run(int argc, char** argv) {
  std::vector<const char*> args = {argv[0]};
  std::string out;
  test_support::LinearModel model;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--driver-out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--driver-unused") {
      model.unused = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  auto parsed = train::parse_command_line(static_cast<int>(args.size()), args.data());
  if (!parsed.config) {
    std::fputs(parsed.text.c_str(), stdout);
    return 0;
  }
  const train::Config cfg = *parsed.config;
  std::signal(SIGPIPE, SIG_IGN);  // as sinew-train: a dead peer's socket must not kill this process
  // Before MPI_Init and anything that may rewrite argv: a replacement is started with this command line.
  auto spawn = membership::SpawnCommand::of_this_process(argc, argv);
  membership::JoinDeadline join_deadline;
  std::optional<mpi::Environment> env;
  try {
    env.emplace(&argc, &argv);
  } catch (const CommFailure&) {
    if (!join_deadline.spawned()) throw;
    membership::JoinDeadline::leave();  // an abandoned spawn: never a member
  }
  std::optional<membership::Group> joined;
  try {
    joined.emplace(membership::Group::attach(std::move(spawn), cfg.spares));
  } catch (const membership::JoinFailed&) {
    env->finalize(0, kFinalizeBound);
    return 0;
  }
  join_deadline.joined();
  auto& group = *joined;
  group.watch(std::chrono::milliseconds(cfg.stall_timeout_ms));
  log::init(group.rank(), group.size(), log::parse_level(cfg.log_level));
  int code = 0;
  {
    const optim::OptimizerOptions oo = train::optimizer_options(cfg);
    test_support::FlatWorkload work(model.num_params(), oo, model.ready_order(), model.views());
    train::SessionParts parts;
    parts.train_size = kTrain;
    train::Session s(cfg, std::move(group), work, std::move(parts));

    const train::Summary sum = test_support::drive(s, model, work, {kTestFirst, kTest});
    if (!sum.left && s.rank() == 0 && !out.empty()) {
      std::ofstream f(out);
      f << "{\"params\": [";
      const auto p = work.params();
      for (std::size_t i = 0; i < p.size(); ++i) f << (i > 0 ? ", " : "") << fmt::format("{:.9g}", p[i]);
      f << "], \"world_size\": " << s.size() << "}\n";
    }
    code = sum.exit_code();
  }
  env->finalize(code, kFinalizeBound);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "session-driver: %s\n", e.what());
    return static_cast<int>(e.exit_code());
  }
}
