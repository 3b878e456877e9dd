#include "sinew/train/process.hpp"

#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdio>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"

namespace sinew::train {

Process::Process(const Config& cfg, membership::SpawnCommand spawn, int* argc, char*** argv) {
  // A member that dies leaves sockets behind whose next write raises SIGPIPE. The MPI library turns the
  // write's EPIPE into a process failure that ULFM reports; the signal's default action would instead
  // kill this process too (measured in the chaos run: a spawned replacement, which talks to the others
  // over TCP, died of SIGPIPE when a member was killed, and mpirun then returned 141).
  std::signal(SIGPIPE, SIG_IGN);
  // A process spawned by grow() leaves (exit 0) if it cannot join within its parents' deadline: before
  // MPI_Init, since an abandoned spawn leaves it blocked inside MPI_Init.
  membership::JoinDeadline join_deadline;
  try {
    env_.emplace(argc, argv);
  } catch (const CommFailure& e) {
    // A spawned process whose MPI_Init failed (the parents abandoned the spawn): it never was a member.
    if (!join_deadline.spawned()) throw;
    std::fprintf(stderr, "[sinew] spawned process: %s; leaving\n", e.message().c_str());
    membership::JoinDeadline::leave();
  }
  try {
    group_.emplace(membership::Group::attach(std::move(spawn), cfg.spares));
  } catch (const membership::JoinFailed& e) {
    // Never a member: the parents recover without this process, nobody waits for it (exit 0).
    std::fprintf(stderr, "[sinew] spawned process: %s; leaving (exit code 0)\n", e.message().c_str());
    env_->finalize(0, kFinalizeBound);
    return;
  }
  join_deadline.joined();
  // Every process (members, spares, a spawned replacement) watches another one for stalls.
  group_->watch(std::chrono::milliseconds(cfg.stall_timeout_ms));
  log::init(group_->rank(), group_->size(), log::parse_level(cfg.log_level));
  if (group_->role() == membership::Role::kRecovered)
    spdlog::info("spawned as rank {} of {} to replace failed ranks", group_->rank(), group_->size());
}

membership::Group Process::take_group() {
  SINEW_ENFORCE(group_.has_value(), "Process::take_group: no group (taken, or never joined)");
  membership::Group g = std::move(*group_);
  group_.reset();
  return g;
}

int Process::finalize(int code) {
  if (env_) env_->finalize(code, kFinalizeBound);
  env_.reset();
  return code;
}

}  // namespace sinew::train
