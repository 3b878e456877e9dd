// sinew-train: elastic data-parallel training. Thin: parse options, start MPI, run the trainer.
#include <cstdio>
#include <utility>

#include "common.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/train/trainer.hpp"

int main(int argc, char** argv) {
  return sinew::apps::guarded_main([&] {
    // Options are checked before MPI starts, so that --help and usage errors need no launcher.
    auto parsed = sinew::train::parse_command_line(argc, argv);
    if (!parsed.config) {
      if (sinew::apps::launcher_rank() == 0) std::fputs(parsed.text.c_str(), stdout);
      return 0;
    }
    const auto& cfg = *parsed.config;
    // Recorded before MPI_Init can touch argv: grow() starts new members with this same command, and
    // they, running this main(), record an equal one for their own growth.
    auto spawn = sinew::membership::SpawnCommand::of_this_process(argc, argv);
    sinew::mpi::Environment env(&argc, &argv);
    // A spawned replacement joins its parents here.
    auto group = sinew::membership::Group::attach(std::move(spawn));
    sinew::log::init(group.rank(), group.size(), sinew::log::parse_level(cfg.log_level));
    if (group.rank() == 0 && group.role() == sinew::membership::Role::kInitial) {
      spdlog::info("{} ({} ranks; ULFM {}; --elastic {})", sinew::mpi::library_version(), group.size(),
                   sinew::mpi::ulfm_enabled() ? "enabled" : "not enabled",
                   sinew::name_of(sinew::train::kElasticNames, cfg.elastic));
    }
    if (group.role() == sinew::membership::Role::kRecovered) {
      spdlog::info("spawned as rank {} of {} to replace failed ranks", group.rank(), group.size());
    }
    sinew::train::Trainer trainer(cfg, std::move(group));
    const auto s = trainer.run();
    if (!s.left && trainer.rank() == 0) {
      if (!s.below_min_ranks) {
        spdlog::info("done: {} steps, {} epochs, test accuracy {:.2f}%, {:.0f} samples/s, {:.1f} s", s.steps,
                     s.epochs, 100 * s.test_accuracy, s.samples_per_s, s.wall_s);
      }
      if (s.stopped_by_signal != 0) {
        spdlog::warn("stopped by signal {} after a checkpoint; relaunch with --resume auto to continue",
                     s.stopped_by_signal);
      } else if (!s.checkpoint_error.empty()) {
        spdlog::error("training finished but a checkpoint failed: {}", s.checkpoint_error);
      }
    }
    return s.exit_code();
  });
}
