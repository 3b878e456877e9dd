// sinew-train: elastic data-parallel training. Thin: parse options, start MPI, run the trainer.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "common.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/launch.hpp"
#include "sinew/core/log.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/model/workload.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/serve/service_source.hpp"
#include "sinew/train/control.hpp"
#include "sinew/train/process.hpp"
#include "sinew/train/trainer.hpp"

int main(int argc, char** argv) {
  // First of all: a stop or leave signal from now on is recorded, not the end of the process. Slurm's
  // --signal=B:USR1@T, forwarded by the batch script, or a preemption's SIGTERM can come while MPI starts
  // or the data loads; the trainer acts on it at its first agreement (checkpoint, exit code 75).
  sinew::train::Signals::catch_early();
  return sinew::apps::guarded_main([&] {
    // The launch environment, read once before MPI_Init (which changes the environment) and any thread.
    const auto& launch = sinew::launch::current();
    // Options are checked before MPI starts, so that --help and usage errors need no launcher.
    auto parsed = sinew::train::parse_command_line(argc, argv, launch);
    if (!parsed.config) {
      if (sinew::apps::launcher_rank() == 0) std::fputs(parsed.text.c_str(), stdout);
      return 0;
    }
    const auto& cfg = *parsed.config;
    // So is the restart generation (a malformed SINEW_RESTART_GENERATION or SLURM_RESTART_COUNT).
    (void)launch.restart_generation();
    // Recorded before MPI_Init can touch argv: grow() starts new members with this same command, and
    // they, running this main(), record an equal one for their own growth.
    sinew::train::Process process(cfg, sinew::membership::SpawnCommand::of_this_process(argc, argv), &argc,
                                  &argv);
    if (!process.joined()) return 0;  // spawned, never a member: the parents recovered without it
    const auto& group = process.group();
    if (group.rank() == 0 && group.role() == sinew::membership::Role::kInitial) {
      spdlog::info("{} ({} ranks{}; ULFM {}; --elastic {}; launch: {})", sinew::mpi::library_version(),
                   group.size(), group.spares() > 0 ? fmt::format(" + {} hot spares", group.spares()) : "",
                   sinew::mpi::ulfm_enabled() ? "enabled" : "not enabled",
                   sinew::name_of(sinew::train::kElasticNames, cfg.elastic), launch.describe());
    }
    int code = 0;
    {
      sinew::train::Trainer trainer(cfg, process.take_group(), sinew::model::make_workload,
                                    sinew::serve::service_source);
      const auto s = trainer.run();
      if (!s.left && trainer.rank() == 0) {
        if (!s.below_min_ranks) {
          const std::string acc = std::isnan(s.test_accuracy) ? std::string("not evaluated")
                                                              : fmt::format("{:.2f}%", 100 * s.test_accuracy);
          spdlog::info("done: {} steps, {} epochs, test accuracy {}, {:.0f} samples/s, {:.1f} s", s.steps,
                       s.epochs, acc, s.samples_per_s, s.wall_s);
        }
        if (s.stopped_by_signal != 0) {
          spdlog::warn("stopped by signal {} after a checkpoint; relaunch with --resume auto to continue",
                       s.stopped_by_signal);
        } else if (!s.checkpoint_error.empty()) {
          spdlog::error("training finished but a checkpoint failed: {}", s.checkpoint_error);
        }
      }
      code = s.exit_code();
    }  // the trainer is gone: metrics, audit and checkpoint files are written and closed
    // The results are durable now; after failures MPI_Finalize can wait for ever (a peer that died, a
    // spawn abandoned in MPI), so it is bounded, and the process exits with the run's code either way.
    return process.finalize(code);
  });
}
