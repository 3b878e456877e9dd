#include "sinew/train/checkpoints.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/checkpoint/writer.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace sinew::train {

CheckpointPolicy::CheckpointPolicy(const Config& cfg, const comm::Options& op, TrainState& state,
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

void CheckpointPolicy::save(Fabric& fabric, const char* why, bool async) {
  auto* writer = fabric.writer();
  if (writer == nullptr) return;
  try {
    fabric.algorithm().consensus();  // one model: decentralized ranks' models differ between consensus points
    auto snap = [&] {
      return state_.snapshot(fabric.algorithm(), fabric.rank(), fabric.size(), config_json_);
    };
    if (async) {
      if (writer->save_async(snap())) pending_reason_ = why;
      return;
    }
    if (auto r = writer->finish_async()) report(fabric, *r, pending_reason_);
    report(fabric, writer->save(snap()), why);
  } catch (const CheckpointError& e) {
    failed(fabric, why, e.message());
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

bool CheckpointPolicy::resume(Fabric& fabric) {
  if (cfg_.resume == "never" || (cfg_.resume == "auto" && cfg_.checkpoint_dir.empty())) return false;
  auto& backend = fabric.backend();
  std::string path;
  ResumeEvent ev;
  if (cfg_.resume == "auto") {
    if (fabric.rank() == 0) {
      auto latest = checkpoint::find_latest(cfg_.checkpoint_dir);
      for (const auto& e : latest.skipped) {
        spdlog::warn("resume: skipping {}: {}", e.path, e.reason);
        ev.skipped.push_back({{"path", e.path}, {"reason", e.reason}});
      }
      if (latest.found) path = latest.found->path;
    }
    std::vector<std::uint8_t> buf(4096, 0);  // the chosen path, NUL-terminated
    std::copy_n(path.begin(), std::min(path.size(), buf.size() - 1), buf.begin());
    backend.broadcast_sync(comm::Buffer::of(std::span<std::uint8_t>(buf)), 0, op_);
    path.assign(reinterpret_cast<const char*>(buf.data()));
    if (path.empty()) {
      if (fabric.rank() == 0)
        spdlog::info("resume: no valid checkpoint in {}, starting fresh", cfg_.checkpoint_dir);
      return false;
    }
  } else {
    path = cfg_.resume;
  }
  // Every rank loads (and verifies) the whole state; a failure anywhere fails everywhere.
  std::int64_t ok = 1;
  std::string why;
  checkpoint::TrainingState st;
  const auto load_start = Clock::now();
  try {
    st = checkpoint::load(path);
    state_.apply(st, path, fabric.algorithm(), fabric.rank(), fabric.size());
  } catch (const CheckpointError& e) {
    ok = 0;
    why = e.message();
  }
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(&ok, 1)), comm::ReduceOp::kMin, op_);
  if (!ok) {
    SINEW_THROW(CheckpointError, "cannot resume: {}",
                why.empty() ? fmt::format("{}: another rank could not load it", path) : why);
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
