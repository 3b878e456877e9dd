#include "sinew/train/elastic.hpp"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <span>
#include <string>

#include "sinew/core/log.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/membership/repair_watch.hpp"

namespace sinew::train {

namespace {

double ms_since(Clock::time_point t) { return seconds_since(t) * 1e3; }

/// Arms the deadline of a repair step (membership/repair_watch.hpp). Steps that move the model (building
/// the backends, whose algorithm may exchange it; the state synchronisation) also get the collectives' own
/// deadline, --timeout-ms: they are bounded by it already, the watch catches a call that never returns to
/// check it.
membership::RepairWatch::Guard repair_step(const Config& cfg, const membership::Group& group,
                                           const char* what, bool moves_data) {
  return group.repair_guard(what, std::chrono::milliseconds(moves_data ? cfg.timeout_ms : 0));
}

/// Collective over `comm`: true on its lowest rank on this node (MPI_COMM_TYPE_SHARED).
bool first_on_node(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
    SINEW_THROW(CommFailure, "a member failed while the group found its nodes (MPI_Comm_split_type)");
  int r = 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r == 0;
}

double unix_now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

ElasticController::ElasticController(const Config& cfg, membership::Group& group, const FabricSetup& setup,
                                     ReplicatedState& state, LrRescaler& lr, const StepControl& control,
                                     Events& events, const fault::Plan& faults)
    : cfg_(cfg),
      group_(group),
      setup_(setup),
      state_(state),
      lr_(lr),
      control_(control),
      events_(events),
      faults_(faults) {}

void ElasticController::connect() {
  fabric_.reset();
  // The fabric's backend duplicates the group's communicator: same ranks. Set before building it, so
  // that the algorithm's own events (auto's decision) already go to the right place.
  log::set_rank(group_.rank(), group_.size());
  events_.on_view(group_.rank());
  const auto deadline = repair_step(cfg_, group_, "building the backends over the group", true);
  // One process per node keeps the node's copy of the state (state_mirror.hpp): the lowest rank there.
  if (state_.mirrored()) state_.set_mirror_writer(first_on_node(group_.comm().get()));
  fabric_ = std::make_unique<Fabric>(group_, setup_);
}

double ElasticController::synchronise(bool after_failure) {
  const auto t = Clock::now();
  const auto deadline = repair_step(cfg_, group_, "the state synchronisation", true);
  // Algorithms whose ranks step on their own rewind to the last step every member completed (lockstep()).
  const bool lockstep = fabric_->algorithm().lockstep();
  state_.synchronise(fabric_->backend(), setup_.op, after_failure && !lockstep);
  fabric_->algorithm().reset();
  if (!lockstep) state_.mark_agreed();  // every member holds this state now
  return ms_since(t);
}

void ElasticController::rescale(int from_world, const char* why) {
  const int world = fabric_->size();
  const RescaleEvent e = lr_.rescale(state_.pos(), from_world, world, why);
  events_.emit(e);
  if (fabric_->rank() == 0 && from_world != world) {
    spdlog::info("rescale ({}): {} -> {} ranks, global batch {}, lr factor {:.3g} -> {:.3g}{}", why,
                 from_world, world, e.global_batch, e.lr_factor_from, e.lr_factor_to,
                 e.ramp_steps > 0 ? fmt::format(" over {} steps", e.ramp_steps) : "");
  }
}

RecoveryReport ElasticController::recover(const CommFailure& e) {
  RecoveryReport rep;
  rep.detected = Clock::now();
  const int from = fabric_ ? fabric_->size() : group_.size();
  FailureEvent ev;
  ev.step = state_.pos().step;
  ev.error = e.message();
  ev.from_world_size = from;
  ev.detected_unix_time = unix_now_s();
  spdlog::warn("failure at step {}: {}; recovering in place", ev.step + 1, e.message());
  const auto hook = [this](int) {
    faults_.at(fault::Point::kRecovery, state_.pos().step + 1);
    faults_.at(fault::Point::kRecoveryHang, state_.pos().step + 1);
  };
  for (;;) {
    try {
      // Abort the old view's backends first (NCCL, then the MPI revoke): a member blocked in them (the
      // communication thread, a GPU wait) returns.
      if (fabric_) {
        const auto deadline = repair_step(cfg_, group_, "the abort of the failed view's backends", false);
        ev.on_device = static_cast<bool>(setup_.attach_device);
        ev.nccl_abort_ms += fabric_->abort();
      }
      // With hot spares the pool is reformed: the survivors plus as many spares as members were lost
      // (back to the size before the failure); without, the view shrinks to the survivors.
      const auto sr = group_.pooled() ? group_.reform(from, /*leaving=*/false, hook) : group_.shrink(hook);
      fabric_.reset();
      ev.revoke_ms += sr.revoke_ms;
      ev.shrink_ms += sr.shrink_ms;
      ev.agree_ms += sr.agree_ms;
      ev.attempts += sr.attempts;
      ev.lost += sr.lost;
      ev.promoted += sr.promoted;
      settle(from, "failure", &ev);
      break;
    } catch (const CommFailure& again) {
      spdlog::warn("another failure during recovery: {}; recovering again", again.message());
      if (fabric_) fabric_->abort();  // the rebuilt view's backend, if any, before it is freed
      fabric_.reset();
    }
  }
  const int world = fabric_->size();
  ev.world_size = world;
  ev.membership_epoch = group_.epoch();
  ev.resumed_step = state_.pos().step;
  ev.role = name_of(membership::kRoleNames, group_.role());
  events_.emit(ev);
  ShrinkEvent sh;
  sh.reason = "failure";
  sh.step = state_.pos().step;
  sh.from_world_size = from;
  sh.world_size = from - ev.lost;
  sh.membership_epoch = group_.epoch();
  events_.emit(sh);
  if (fabric_->rank() == 0) {
    const int spawned = world - (from - ev.lost) - ev.promoted;
    std::string back;
    if (world > from - ev.lost) {
      back = fmt::format(", back to {} (", world);
      if (ev.promoted > 0) back += fmt::format("{} hot spare{}", ev.promoted, ev.promoted > 1 ? "s" : "");
      if (ev.promoted > 0 && spawned > 0) back += ", ";
      if (spawned > 0) back += fmt::format("{} spawned in {:.0f} ms", spawned, ev.spawn_ms);
      back += ")";
    }
    spdlog::warn(
        "recovered in place: {} -> {} ranks{} ({}revoke {:.1f} ms, shrink {:.1f} ms, agree {:.1f} ms, "
        "rebuild {:.1f} ms, state sync {:.1f} ms{}); continuing at step {}",
        from, from - ev.lost, back,
        ev.on_device
            ? fmt::format("NCCL abort {:.1f} ms, NCCL init {:.1f} ms, ", ev.nccl_abort_ms, ev.nccl_init_ms)
            : "",
        ev.revoke_ms, ev.shrink_ms, ev.agree_ms, ev.rebuild_ms, ev.sync_ms,
        ev.reshard_ms >= 0
            ? fmt::format(" of which the reshard {:.1f} ms, {:.1f} MB of state kept by moving its "
                          "pages",
                          ev.reshard_ms, static_cast<double>(ev.reshard_moved_bytes) / 1e6)
            : "",
        state_.pos().step + 1);
  }
  rep.world_size = world;
  return rep;
}

void ElasticController::settle(int from, const char* why, FailureEvent* ev) {
  const auto t = Clock::now();
  connect();
  const double rebuild = ms_since(t);
  const double nccl_init = fabric_->nccl_init_ms();
  const double sync = synchronise(/*after_failure=*/ev != nullptr);  // survivors of a failure pass ev
  if (ev != nullptr) {
    ev->rebuild_ms = rebuild;
    ev->nccl_init_ms = nccl_init;
    ev->sync_ms = sync;
    ev->reshard_ms = state_.reshard_ms();
    ev->reshard_moved_bytes = state_.reshard_moved_bytes();
  }
  rescale(from, why);
  // Every member now holds the same position, hence the same target.
  const int target = control_.target_size(state_.pos());
  if (cfg_.grow && target > fabric_->size()) {
    const auto tg = Clock::now();
    grow_to(target, "replace failed ranks");
    if (ev != nullptr) ev->spawn_ms += ms_since(tg);
  }
}

void ElasticController::join_promoted(const membership::ShrinkReport& how) {
  // The members are in recover() or grow_to(), right after their reform: take the same steps. This
  // process has no state of its own; the synchronisation takes the most advanced member's.
  state_.pos().step = -1;
  try {
    settle(how.from_size, how.lost > 0 ? "failure" : "grow", nullptr);
  } catch (const CommFailure& e) {
    // A member died while this spare was joining: it is a member now and takes part in the recovery.
    recover(e);
  }
}

void ElasticController::grow_to(int target, const char* why) {
  const int from = fabric_->size();
  fabric_.reset();
  const auto t = Clock::now();
  GrowEvent ev;
  ev.reason = why;
  ev.step = state_.pos().step;
  ev.from_world_size = from;
  // The fabric and the state over the grown view (spares promoted, or processes spawned).
  auto over_new_view = [&] {
    const auto tc = Clock::now();
    connect();
    ev.rebuild_ms = ms_since(tc);
    ev.sync_ms = synchronise();
    ev.world_size = fabric_->size();
    ev.membership_epoch = group_.epoch();
  };
  if (group_.pooled() && group_.spares() > 0) {
    // Hot spares first: they are running already and have the data loaded. They join the members'
    // next steps (join_promoted); a shortfall (spares that died meanwhile) is spawned by settle().
    const auto sr = group_.reform(target, /*leaving=*/false);
    ev.promoted = sr.promoted;
    ev.ms = ms_since(t);
    over_new_view();
    events_.emit(ev);
    if (fabric_->rank() == 0) {
      spdlog::info(
          "grew from {} to {} ranks ({}): {} hot spare{} promoted in {:.1f} ms, state sync {:.1f} ms", from,
          fabric_->size(), why, sr.promoted, sr.promoted == 1 ? "" : "s", ev.ms, ev.sync_ms);
    }
    rescale(from, "grow");
    if (target > fabric_->size()) grow_to(target, why);
    return;
  }
  membership::GrowReport rep;
  try {
    // The spawn has its own deadline, far shorter than the collectives' one: a spawn that cannot complete
    // (Open MPI 5.0.7 blocks it for ever when a member dies during it) is given up, not waited for.
    rep = group_.grow(target - from, std::chrono::milliseconds(cfg_.spawn_timeout_ms),
                      [&] { faults_.at(fault::Point::kSpawn, state_.pos().step + 1); });
  } catch (const membership::SpawnError& e) {
    // Every member is alive and the view unchanged (no free slots, or the spawn timed out): go on at this
    // size, and do not try again (until the job server asks for another size).
    connect();
    state_.pos().target_override = from;
    ev.world_size = from;
    ev.error = e.message();
    events_.emit(ev);
    if (fabric_->rank() == 0)
      spdlog::warn("cannot grow to {} ranks ({}); continuing with {}", target, e.message(), from);
    return;
  }
  over_new_view();
  ev.spawn_ms = rep.spawn_ms;
  ev.merge_ms = rep.merge_ms;
  ev.ms = ms_since(t);
  events_.emit(ev);
  if (fabric_->rank() == 0) {
    spdlog::info("grew from {} to {} ranks ({}): spawn {:.0f} ms, state sync {:.1f} ms", from,
                 fabric_->size(), why, rep.spawn_ms, ev.sync_ms);
  }
  rescale(from, "grow");
}

bool ElasticController::leave(const std::vector<bool>& leaving, const char* why) {
  const auto t = Clock::now();
  const int from = fabric_->size();
  const bool me = leaving[static_cast<std::size_t>(fabric_->rank())];
  fabric_->algorithm().consensus();  // what the leaving ranks learned stays with the group
  state_.hand_over(fabric_->backend(), setup_.op, leaving);  // and their shards of a sharded state
  if (me) spdlog::info("leaving the group at step {} ({})", state_.pos().step, why);
  fabric_.reset();
  if (group_.pooled()) {
    group_.reform(0, me);  // the spares wake for it and stay spares
  } else {
    group_.split_leave(me);
  }
  if (me) return true;
  connect();
  ShrinkEvent ev;
  ev.reason = "leave";
  ev.why = why;
  ev.step = state_.pos().step;
  ev.from_world_size = from;
  ev.world_size = fabric_->size();
  ev.membership_epoch = group_.epoch();
  ev.ms = ms_since(t);
  events_.emit(ev);
  rescale(from, "leave");
  return false;
}

/// A relaunch: if a node's mirror holds a newer state than the checkpoint just loaded (the job failed
/// after it), the members take the newest one from the memory of the nodes that kept it.
void ElasticController::resume_from_mirror(int generation) {
  const auto t = Clock::now();
  auto& f = fabric();
  const std::int64_t checkpoint_step =
      state_.pos().resumed != 0 ? state_.pos().step : -1;  // the same on every rank
  const auto loaded = state_.load_mirror();
  std::int64_t newest = loaded ? *loaded : -1;
  f.backend().allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(&newest, 1)), comm::ReduceOp::kMax,
                             setup_.op);
  if (newest < 0) return;
  synchronise();  // the most advanced member's state everywhere, checked equal
  ResumeEvent ev;
  ev.path = state_.mirror_path();
  ev.step = state_.pos().step;
  ev.epoch = state_.pos().epoch;
  ev.cursor = static_cast<std::uint64_t>(state_.pos().cursor);
  ev.world_size = f.size();
  ev.load_ms = seconds_since(t) * 1e3;
  ev.generation = generation;
  events_.emit(ev);
  if (f.rank() == 0) {
    spdlog::info("resumed from the state kept in node memory ({}): step {}, epoch {}, sample {}{}", ev.path,
                 ev.step, ev.epoch + 1, ev.cursor,
                 checkpoint_step >= 0
                     ? fmt::format(" ({} steps after the checkpoint)", ev.step - checkpoint_step)
                     : " (no checkpoint)");
  }
}

}  // namespace sinew::train
