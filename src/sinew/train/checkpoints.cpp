#include "sinew/train/checkpoints.hpp"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <vector>

#include <nlohmann/json.hpp>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/checkpoint/writer.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::train {

CheckpointPolicy::CheckpointPolicy(const Config& cfg, const comm::Options& op, ReplicatedState& state,
                                   Events& events, int generation)
    : cfg_(cfg),
      op_(op),
      state_(state),
      events_(events),
      generation_(generation),
      config_json_(to_json(cfg).dump()) {}

bool CheckpointPolicy::in_flight(Fabric& fabric) {
  return fabric.writer() != nullptr && fabric.writer()->async_in_flight();
}

bool CheckpointPolicy::save(Fabric& fabric, const char* why, bool async) {
  auto* writer = fabric.writer();
  if (writer == nullptr) return false;
  try {
    fabric.algorithm().consensus();  // one model: decentralized ranks' models differ between consensus points
    if (!fabric.algorithm().lockstep()) state_.mirror();  // the one model into the node's copy as well
    auto snap = [&] { return state_.snapshot_ref(fabric.algorithm(), fabric.size(), config_json_); };
    if (async) {
      if (writer->save_async(snap())) pending_reason_ = why;
      return false;
    }
    if (auto r = writer->finish_async()) report(fabric, *r, pending_reason_);
    report(fabric, writer->save(snap()), why);
    return true;
  } catch (const CheckpointError& e) {
    failed(fabric, why, e.message());
    return false;
  }
}

void CheckpointPolicy::progress(Fabric& fabric, bool wait) {
  if (!in_flight(fabric)) return;
  auto* writer = fabric.writer();
  try {
    if (auto r = wait ? writer->finish_async() : writer->progress_async())
      report(fabric, *r, pending_reason_);
  } catch (const CheckpointError& e) {
    failed(fabric, pending_reason_, e.message());
  }
}

void CheckpointPolicy::report(Fabric& fabric, const checkpoint::SaveResult& r, const std::string& why) {
  if (r.skipped) return;
  CheckpointEvent e;
  e.step = r.step;
  e.path = r.path;
  e.reason = why;
  e.bytes = r.bytes;
  e.write_ms = r.write_ms;
  e.commit_ms = r.commit_ms;
  e.world_size = fabric.size();
  events_.emit(e);
  if (fabric.rank() == 0) {
    spdlog::info("checkpoint committed: {} ({:.1f} MB, write {:.0f} ms, commit {:.0f} ms)", r.path,
                 static_cast<double>(r.bytes) / 1e6, r.write_ms, r.commit_ms);
  }
}

void CheckpointPolicy::failed(Fabric& fabric, const std::string& why, const std::string& message) {
  error_ = message;
  CheckpointEvent e;
  e.step = state_.pos().step;
  e.reason = why;
  e.error = message;
  events_.emit(e);
  if (fabric.rank() == 0)
    spdlog::error("checkpoint failed at step {}, training goes on: {}", e.step, message);
}

namespace {

/// Rank 0's choice, a path (empty: none), made known to every rank.
std::string broadcast_path(comm::Backend& backend, const comm::Options& op, std::string path) {
  std::vector<std::uint8_t> buf(4096, 0);  // NUL-terminated
  std::copy_n(path.begin(), std::min(path.size(), buf.size() - 1), buf.begin());
  backend.broadcast_sync(comm::Buffer::of(std::span<std::uint8_t>(buf)), 0, op);
  return reinterpret_cast<const char*>(buf.data());
}

}  // namespace

std::string CheckpointPolicy::choose(Fabric& fabric, ResumeEvent& ev, std::int64_t below_step) {
  std::string path;
  if (fabric.rank() != 0) return broadcast_path(fabric.backend(), op_, path);
  const auto search_start = Clock::now();
  checkpoint::FindOptions fo;
  fo.wait_s = cfg_.resume_wait_s;
  fo.quick = true;  // the data is verified as it is loaded
  fo.below_step = below_step;
  fo.on_wait = [&](const checkpoint::Entry& e) {
    std::string names;
    for (const auto& m : e.missing) names += (names.empty() ? "" : ", ") + m;
    spdlog::warn(
        "resume: {}: {} file{} missing: {} (a storage server down?); waiting up to {:.0f} s for them "
        "(--resume-wait)",
        e.path, e.missing.size(), e.missing.size() == 1 ? "" : "s", names, cfg_.resume_wait_s);
  };
  fo.on_found = [](const checkpoint::Entry& e, double waited) {
    spdlog::info("resume: {}: the missing files reappeared after {:.1f} s", e.path, waited);
  };
  auto latest = checkpoint::find_latest(cfg_.checkpoint_dir, fo);
  ev.waited_s += seconds_since(search_start);
  for (const auto& e : latest.skipped) {
    spdlog::warn("resume: skipping {}: {}", e.path, e.reason);
    ev.skipped.push_back({{"path", e.path}, {"reason", e.reason}, {"missing", e.missing}});
    if (checkpoint::is_committed(e.path)) newest_committed_ = std::max(newest_committed_, e.step);
  }
  if (latest.found) path = latest.found->path;
  return broadcast_path(fabric.backend(), op_, path);
}

bool CheckpointPolicy::resume(Fabric& fabric) {
  if (cfg_.resume == "never" || (cfg_.resume == "auto" && cfg_.checkpoint_dir.empty())) return false;
  auto& backend = fabric.backend();
  const bool automatic = cfg_.resume == "auto";
  ResumeEvent ev;
  newest_committed_ = -1;
  std::string path = automatic ? choose(fabric, ev, std::numeric_limits<std::int64_t>::max()) : cfg_.resume;
  bool overwritten = false;  // a failed load may have left part of a checkpoint in the model
  std::vector<std::string> failures;
  checkpoint::ManifestInfo info;
  const auto load_start = Clock::now();
  for (;;) {
    if (path.empty()) {
      if (overwritten) {
        SINEW_THROW(CheckpointError, "cannot resume: no checkpoint in {} could be loaded ({})",
                    cfg_.checkpoint_dir, fmt::join(failures, "; "));
      }
      if (fabric.rank() == 0) {
        if (newest_committed_ >= 0) {
          spdlog::warn("resume: no committed checkpoint in {} could be loaded: starting fresh, {} steps lost",
                       cfg_.checkpoint_dir, newest_committed_);
        } else {
          spdlog::info("resume: no valid checkpoint in {}, starting fresh", cfg_.checkpoint_dir);
        }
      }
      return false;
    }
    // Every rank loads (and verifies) the whole state; a failure anywhere fails everywhere.
    std::int64_t ok = 1;
    std::string why;
    try {
      info = state_.load(path, fabric.algorithm(), fabric.rank(), fabric.size());
    } catch (const CheckpointError& e) {
      ok = 0;
      why = e.message();
    }
    backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(&ok, 1)), comm::ReduceOp::kMin, op_);
    if (ok) break;
    if (why.empty()) why = fmt::format("{}: another rank could not load it", path);
    if (!automatic) SINEW_THROW(CheckpointError, "cannot resume: {}", why);
    // --resume auto: the data of a checkpoint that passed the quick check is damaged; the next older one.
    overwritten = true;
    failures.push_back(why);
    const auto name = checkpoint::parse_name(std::filesystem::path(path).filename().string());
    if (fabric.rank() == 0) {
      spdlog::warn("resume: skipping {}: {}", path, why);
      ev.skipped.push_back({{"path", path}, {"reason", why}});
      if (name) newest_committed_ = std::max(newest_committed_, name->step);
    }
    path = choose(fabric, ev, name ? name->step : -1);
  }
  const checkpoint::TrainingState& st = info.meta;
  if (fabric.rank() == 0 && newest_committed_ > st.step) {
    ev.steps_lost = newest_committed_ - st.step;
    spdlog::warn("resume: falling back from step {} to {} (step {}): {} steps lost", newest_committed_, path,
                 st.step, ev.steps_lost);
  }
  state_.pos().resumed = 1;
  ev.path = path;
  ev.step = st.step;
  ev.epoch = st.epoch;
  ev.cursor = st.cursor;
  ev.from_world_size = st.world_size;
  ev.world_size = fabric.size();
  ev.load_ms = seconds_since(load_start) * 1e3;
  ev.generation = generation_;
  events_.emit(ev);
  if (fabric.rank() == 0) {
    spdlog::info("resumed from {} (step {}, epoch {}, sample {}/{}, written by {} ranks)", path, st.step,
                 st.epoch + 1, st.cursor, st.dataset_size, st.world_size);
  }
  return true;
}

}  // namespace sinew::train
