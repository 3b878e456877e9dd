#include "sinew/train/replicated_state.hpp"

#include <zlib.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "sinew/algo/algorithm.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/pages.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/train/shards.hpp"
#include "sinew/train/state_mirror.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {

namespace {

/// One line per tensor of the model: its name and shape.
std::vector<std::string> model_lines(const std::vector<TensorView>& views) {
  std::vector<std::string> out;
  out.reserve(views.size());
  for (const TensorView& v : views) out.push_back(fmt::format("{} [{}]", v.name, fmt::join(v.shape, ", ")));
  return out;
}

/// Every first-launch member must train the same model: its tensors' names and shapes are compared with
/// rank 0's (collective) before the parameters are made rank 0's, which for models of another size would
/// otherwise fail as a broadcast of the wrong length. Throws InvalidArgument on every rank; the ranks whose
/// model differs name the first tensor that does.
void check_same_model(comm::Backend& backend, const comm::Options& op, const workload::Workload& work) {
  const std::vector<std::string> lines = model_lines(work.views());
  std::string mine = fmt::format("{}", fmt::join(lines, "\n"));
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, reinterpret_cast<const Bytef*>(mine.data()), static_cast<uInt>(mine.size()));
  std::int64_t cmp[2] = {static_cast<std::int64_t>(crc), -static_cast<std::int64_t>(crc)};
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(cmp)), comm::ReduceOp::kMax, op);
  if (cmp[0] == -cmp[1]) return;
  std::int64_t len[1] = {static_cast<std::int64_t>(mine.size())};
  backend.broadcast_sync(comm::Buffer::of(std::span<std::int64_t>(len)), 0, op);
  std::string root(static_cast<std::size_t>(len[0]), '\0');
  if (backend.rank() == 0) root = mine;
  backend.broadcast_sync(comm::Buffer::of(std::as_writable_bytes(std::span<char>(root))), 0, op);
  if (root == mine) {
    SINEW_THROW(InvalidArgument,
                "the ranks train different models (this rank's is rank 0's; the ranks whose model differs "
                "name the first tensor that does): build the same model with the same arguments everywhere");
  }
  std::vector<std::string> theirs;
  for (std::size_t a = 0, b; a <= root.size(); a = b + 1) {
    b = root.find('\n', a);
    if (b == std::string::npos) b = root.size();
    theirs.push_back(root.substr(a, b - a));
  }
  std::size_t i = 0;
  while (i < lines.size() && i < theirs.size() && lines[i] == theirs[i]) ++i;
  SINEW_THROW(InvalidArgument,
              "this rank's model differs from rank 0's; the first tensor that does: here {}, on rank 0 {}: "
              "build the same model with the same arguments everywhere",
              i < lines.size() ? lines[i] : "nothing (fewer tensors)",
              i < theirs.size() ? theirs[i] : "nothing (fewer tensors)");
}

}  // namespace

ReplicatedState::ReplicatedState(workload::Workload& work, data::DistributedSampler& sampler,
                                 std::uint64_t seed)
    : work_(work), sampler_(sampler), seed_(seed) {}

ReplicatedState::~ReplicatedState() = default;

std::string ReplicatedState::attach_mirror(const std::string& dir) {
  // The node's copy holds whole tensors and the position only.
  if (shards_ != nullptr) return "with sharded state (each member holds other shards)";
  if (work_.on_device()) return "for a workload on a GPU (a copy to the host every step)";
  // A relaunch from it would lose the state beside the tensors (a script's LR scheduler) and train on
  // with a wrong one. The checkpoint holds it.
  if (work_.has_extra_state())
    return "for a script's own loop (its scheduler and registered state are not in the node's copy)";
  mirror_ =
      std::make_unique<StateMirror>(dir, StateMirror::layout_hash(tensors(), sampler_.dataset_size(), seed_));
  return {};
}

void ReplicatedState::mirror() {
  if (mirror_ && mirror_writer_) mirror_->write(position(), tensors());
}

std::optional<std::int64_t> ReplicatedState::load_mirror() {
  if (!mirror_) return std::nullopt;
  const auto newest = mirror_->newest();
  if (!newest || *newest <= position().step) return std::nullopt;
  // Read into copies first: a read that fails half-way must leave the state as it was.
  const auto all = tensors();
  std::vector<std::vector<float>> copies(all.size());
  NamedSpans into;
  for (std::size_t i = 0; i < all.size(); ++i) {
    copies[i].resize(all[i].second.size());
    into.emplace_back(all[i].first, copies[i]);
  }
  Position m;
  if (!mirror_->read(m, into)) return std::nullopt;
  for (std::size_t i = 0; i < all.size(); ++i)
    std::copy(copies[i].begin(), copies[i].end(), all[i].second.begin());
  Position p = position();
  p.step = m.step;
  p.epoch = m.epoch;
  p.cursor = m.cursor;
  p.optimizer_steps = m.optimizer_steps;
  p.last_eval_epoch = m.last_eval_epoch;
  p.resumed = 1;
  restore(p);
  work_.to_device();
  return m.step;
}

void ReplicatedState::drop_mirror() {
  if (mirror_) mirror_->remove();
}

std::string ReplicatedState::mirror_path() const { return mirror_ ? mirror_->path() : std::string(); }

const Position& ReplicatedState::position() {
  pos_.epoch = sampler_.epoch();
  pos_.cursor = static_cast<std::int64_t>(sampler_.cursor());
  pos_.optimizer_steps = shards_ != nullptr ? shards_->steps() : work_.optimizer_steps();
  return pos_;
}

void ReplicatedState::restore(const Position& p) {
  pos_ = p;
  sampler_.set_position(p.epoch, static_cast<std::size_t>(p.cursor));
  if (shards_ != nullptr)
    shards_->set_steps(p.optimizer_steps);
  else
    work_.set_optimizer_steps(p.optimizer_steps);
}

std::vector<std::pair<std::string, std::span<float>>> ReplicatedState::tensors() {
  std::vector<std::pair<std::string, std::span<float>>> out;
  out.emplace_back("params", work_.params());
  for (const auto& [name, buf] : work_.optimizer_state()) out.emplace_back("optim/" + name, buf);
  for (const auto& [name, buf] : work_.buffers()) out.emplace_back("buffers/" + name, buf);
  return out;
}

checkpoint::StateRef ReplicatedState::snapshot_ref(algo::Algorithm& algorithm, int world,
                                                   std::string config_json) {
  work_.to_host();
  const Position& p = position();
  checkpoint::StateRef st;
  for (const auto& [name, buf] : tensors()) st.tensors[name] = {buf, false};
  for (const auto& [name, buf] : algorithm.rank_state()) st.tensors[name] = {buf, true};
  if (shards_ != nullptr) {
    // Each member writes its own shard of the optimiser state, which is exactly its slice of the whole
    // tensor in the file (the writer's slices are the shards' layout), and of the parameters.
    SINEW_ENFORCE(shards_->layout().world == world, "checkpoint over {} ranks, shards laid out over {}",
                  world, shards_->layout().world);
    for (const auto& [name, buf] : shards_->own_state())
      st.tensors["optim/" + name] = {buf, false, shards_->layout().total};
  }
  st.meta.step = p.step;
  st.meta.epoch = p.epoch;
  st.meta.cursor = static_cast<std::uint64_t>(p.cursor);
  st.meta.dataset_size = sampler_.dataset_size();
  st.meta.seed = seed_;
  st.meta.optimizer_steps = p.optimizer_steps;
  st.meta.world_size = world;
  st.meta.config_json = std::move(config_json);
  // Per-layer views of "params" ("fc1/weight") and the model's layers, so that readers of the checkpoint
  // can rebuild the model.
  st.meta.views = work_.views();
  st.meta.model_json = work_.description_json();
  st.meta.workload_state = work_.extra_state();
  return st;
}

checkpoint::ManifestInfo ReplicatedState::load(const std::string& path, algo::Algorithm& algorithm, int rank,
                                               int world) {
  checkpoint::ManifestInfo info = checkpoint::read_manifest(path);
  const checkpoint::TrainingState& st = info.meta;
  if (st.dataset_size != sampler_.dataset_size()) {
    SINEW_THROW(CheckpointError,
                "{} was written for {} training samples, this run has {}: another --dataset or "
                "--limit-train?",
                path, st.dataset_size, sampler_.dataset_size());
  }
  if (st.seed != seed_) {
    SINEW_THROW(CheckpointError,
                "{} was written with --seed {}, this run has --seed {}: the data order would "
                "differ",
                path, st.seed, seed_);
  }
  const auto size_of = [&](const std::string& name) -> std::optional<std::uint64_t> {
    for (const auto& t : info.tensors)
      if (t.name == name) return t.size;
    return std::nullopt;
  };
  // Same sizes are not the same model: where the checkpoint names its tensors, each of the workload's must
  // be there with its shape (checked before a byte is read, so nothing is overwritten). The same model in
  // another layout (a PyTorch model's flat buffers follow backward's order, torch/workload.hpp, and a
  // checkpoint may hold the module's) is read tensor by tensor into this run's places.
  std::vector<std::pair<Slice, Slice>> moves;  // (range in the checkpoint, range here) per parameter tensor
  bool relaid = false;
  if (!st.views.empty()) {
    for (const TensorView& v : work_.views()) {
      const auto it = std::find_if(st.views.begin(), st.views.end(), [&](const TensorView& c) {
        return c.tensor == v.tensor && c.name == v.name;
      });
      if (it == st.views.end()) {
        SINEW_THROW(CheckpointError,
                    "{} was written for another model: it has no tensor '{}' (this run trains {})", path,
                    v.name, work_.describe());
      }
      if (it->shape != v.shape) {
        SINEW_THROW(CheckpointError,
                    "{} was written for another model: its tensor '{}' has shape [{}], this run's has [{}]",
                    path, v.name, fmt::join(it->shape, ", "), fmt::join(v.shape, ", "));
      }
      moves.push_back({Slice{it->offset, v.count()}, Slice{v.offset, v.count()}});
      if (it->offset != v.offset) relaid = true;
    }
  }
  // The replicated tensors are read straight into the model and the optimiser.
  std::vector<checkpoint::ReadTarget> targets;
  for (auto& [name, buf] : tensors()) {
    const auto size = size_of(name);
    if (!size) {
      SINEW_THROW(CheckpointError, "{} has no tensor '{}': was it written with another --optimizer?", path,
                  name);
    }
    if (*size != buf.size()) {
      SINEW_THROW(CheckpointError,
                  "{}: tensor '{}' has {} elements, this run needs {}: was it written with another "
                  "--model or --optimizer?",
                  path, name, *size, buf.size());
    }
    const bool params_layout = name == "params" || name.starts_with("optim/");
    if (relaid && params_layout) {
      for (const auto& [from, to] : moves) targets.push_back({name, from.offset, to.of(buf)});
    } else {
      targets.push_back({name, 0, buf});
    }
  }
  // Per-rank algorithm state: this rank's block at the same world size, else the blocks' mean.
  const auto w = static_cast<std::size_t>(world), r = static_cast<std::size_t>(rank);
  struct Averaged {
    std::span<float> buf;
    std::vector<float> all;
  };
  std::vector<Averaged> averaged;
  for (auto& [name, buf] : algorithm.rank_state()) {
    std::fill(buf.begin(), buf.end(), 0.f);
    const auto size = size_of(name);
    if (!size || buf.empty() || relaid) continue;  // (in another layout: started afresh, as at a new size)
    const std::size_t blocks = *size / buf.size();
    if (blocks * buf.size() != *size || blocks == 0)
      SINEW_THROW(CheckpointError, "{}: tensor '{}' has {} elements, not a multiple of {}", path, name, *size,
                  buf.size());
    if (blocks == w) {
      targets.push_back({name, r * buf.size(), buf});
    } else {
      averaged.push_back({buf, std::vector<float>(*size)});
      targets.push_back({name, 0, averaged.back().all});
    }
  }
  if (shards_ != nullptr) {
    // The held shards of the optimiser state, each read from its range of the whole tensor.
    for (const auto& h : shards_->held()) {
      for (const auto& [short_name, buf] : h.opt->state()) {
        const std::string name = "optim/" + short_name;
        const auto size = size_of(name);
        if (!size) {
          SINEW_THROW(CheckpointError, "{} has no tensor '{}': was it written with another --optimizer?",
                      path, name);
        }
        if (*size != shards_->layout().total) {
          SINEW_THROW(CheckpointError, "{}: tensor '{}' has {} elements, this run needs {}", path, name,
                      *size, shards_->layout().total);
        }
        if (!relaid) {
          targets.push_back({name, h.range.offset, buf});
          continue;
        }
        for (const auto& [from, to] : moves) {  // the pieces of the held range, from where the file has them
          const std::size_t lo = std::max(to.offset, h.range.offset);
          const std::size_t hi = std::min(to.end(), h.range.end());
          if (hi > lo)
            targets.push_back(
                {name, from.offset + (lo - to.offset), buf.subspan(lo - h.range.offset, hi - lo)});
        }
      }
    }
  }
  checkpoint::load_into(path, targets);
  for (auto& [buf, all] : averaged) {
    const std::size_t blocks = all.size() / buf.size();
    for (std::size_t b = 0; b < blocks; ++b)
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] += all[b * buf.size() + i];
    for (auto& x : buf) x /= static_cast<float>(w);
  }
  Position p = position();
  p.step = st.step;
  p.epoch = st.epoch;
  p.cursor = static_cast<std::int64_t>(st.cursor);
  p.optimizer_steps = st.optimizer_steps;
  p.last_eval_epoch = st.epoch - 1;
  restore(p);
  work_.to_device();
  work_.load_extra_state(st.workload_state);
  return info;
}

void ReplicatedState::take_rank0(comm::Backend& backend, const comm::Options& op) {
  check_same_model(backend, op, work_);
  // Same seed gives the same initial weights everywhere; the broadcast makes it a guarantee, as DDP does.
  backend.broadcast_sync(comm::Buffer::of(work_.params()), 0, op);
  for (const auto& [name, buf] : work_.buffers()) backend.broadcast_sync(comm::Buffer::of(buf), 0, op);
}

void ReplicatedState::reshard(comm::Backend& backend, const comm::Options& op, int root,
                              std::int64_t own_step, std::int64_t top, const Position& root_pos) {
  // A member whose reduction of step `top` failed is one step behind the members that completed it (a
  // step's update is the last thing it does, train/session.cpp): it repeats that step's update on its
  // shards with the reduced gradients and the learning rate of the root, which completed it, and takes
  // the root's position at once, so that a failure during the reshard below cannot make it step twice.
  const bool behind = shards_->arranged() && own_step < top;
  if (behind && own_step != top - 1) {
    SINEW_THROW(InternalError, "a member with shards at step {} while another completed step {}", own_step,
                top);
  }
  // With sharded gradients (ZeRO-2) no member has the failed step's reduced gradients of shards it does
  // not hold: a member behind gives its shards up and receives them, like a newcomer, from holders that
  // completed the step (none did: the shard is lost, and the job relaunches from its checkpoint).
  if (shards_->gradients_sharded()) {
    // Sharded parameters: the failed step's gradients are of no use (the step is redone); their memory makes
    // room for the new layout's state, made beside the old one (kept until the reshard succeeded).
    if (shards_->parameters_sharded()) release_pages(work_.grads());
    if (behind) {
      shards_->discard();
      restore(root_pos);
    }
    shards_->reshard(backend, work_.params(), op, backend.rank(), backend.size());
    return;
  }
  std::int64_t any[1] = {behind ? 1 : 0};
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(any)), comm::ReduceOp::kMax, op);
  if (any[0] != 0) {
    float lr[1] = {shards_->last_lr()};
    backend.broadcast_sync(comm::Buffer::of(std::span<float>(lr)), root, op);
    if (backend.rank() == root) {  // on a GPU the step brought its held ranges to the host only
      const Slice all{0, work_.grads().size()};
      work_.grads_to_host(std::span<const Slice>(&all, 1));
    }
    backend.broadcast_sync(comm::Buffer::of(work_.grads()), root, op);
    if (behind) {
      shards_->step(work_.params(), work_.grads(), lr[0]);
      restore(root_pos);
    }
  }
  shards_->reshard(backend, work_.params(), op, backend.rank(), backend.size());
}

double ReplicatedState::reshard_ms() const { return shards_ != nullptr ? shards_->last_reshard_ms() : -1; }

std::size_t ReplicatedState::reshard_moved_bytes() const {
  return shards_ != nullptr ? shards_->last_moved_bytes() : 0;
}

void ReplicatedState::hand_over(comm::Backend& backend, const comm::Options& op,
                                const std::vector<bool>& leaving) {
  if (shards_ == nullptr) return;
  int stay = 0, me = -1;
  for (std::size_t r = 0; r < leaving.size(); ++r) {
    if (leaving[r]) continue;
    if (static_cast<int>(r) == backend.rank()) me = stay;
    ++stay;
  }
  shards_->reshard(backend, work_.params(), op, me, stay);
}

void ReplicatedState::mark_agreed() {
  agreed_pos_ = position();
  const auto all = tensors();
  agreed_.resize(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) agreed_[i].assign(all[i].second.begin(), all[i].second.end());
}

double ReplicatedState::synchronise(comm::Backend& backend, const comm::Options& op, bool rewind) {
  const auto t = Clock::now();
  work_.to_host();
  if (rewind && agreed_pos_ && pos_.step >= 0) {
    const auto all = tensors();
    for (std::size_t i = 0; i < all.size() && i < agreed_.size(); ++i)
      std::copy(agreed_[i].begin(), agreed_[i].end(), all[i].second.begin());
    restore(*agreed_pos_);
  }
  Position p = position();
  // {highest step, whether some member rewound}: a newcomer (a spawned replacement, a promoted spare)
  // does not know whether the others recover from a failure, so the choice below is agreed here.
  std::int64_t top[2] = {p.step, rewind ? 1 : 0};
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(top)), comm::ReduceOp::kMax, op);
  const bool at_top = p.step == top[0];
  std::int64_t src[1] = {at_top ? backend.rank() : std::numeric_limits<std::int64_t>::max()};
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(src)), comm::ReduceOp::kMin, op);
  const int root = static_cast<int>(src[0]);
  const std::int64_t own_step = p.step;
  auto bytes = std::as_writable_bytes(std::span<Position>(&p, 1));
  backend.broadcast_sync(comm::Buffer::of(bytes), root, op);
  if (shards_ != nullptr) reshard(backend, op, root, own_step, top[0], p);
  const auto all = tensors();
  if (top[1] != 0) {
    // Rewound members each hold their own model of the agreed step (their ranks step on their own:
    // the models drift apart between agreements). Every member takes their average, not one of them,
    // which may be well behind the consensus: taking rank 0's cost low_precision_decentralized up to 8
    // points of accuracy after a recovery (chaos seed 11, trials 2, 13, 74).
    float count[1] = {at_top ? 1.f : 0.f};
    backend.allreduce_sync(comm::Buffer::of(std::span<float>(count)), comm::ReduceOp::kSum, op);
    for (const auto& [name, buf] : all) {
      if (!at_top) std::fill(buf.begin(), buf.end(), 0.f);
      backend.allreduce_sync(comm::Buffer::of(buf), comm::ReduceOp::kSum, op);
      for (auto& x : buf) x /= count[0];
    }
  }
  // After an average too: a reduction need not round the same way on every rank. (Sharded: the parameters
  // are whole and equal after the reshard; the checksum below says so.)
  for (const auto& [name, buf] : all)
    if (shards_ == nullptr || name != "params") backend.broadcast_sync(comm::Buffer::of(buf), root, op);
  restore(p);
  work_.to_device();
  // Consistency: a checksum of everything that must be equal, compared as (max, -min).
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&crc](std::span<const std::byte> b) {
    crc = crc32(crc, reinterpret_cast<const Bytef*>(b.data()), static_cast<uInt>(b.size()));
  };
  add(std::as_bytes(std::span<const Position>(&p, 1)));
  for (const TensorView& v : work_.views()) {  // the layout: a member that lays out the model otherwise
    add(std::as_bytes(std::span<const char>(v.name)));
    add(std::as_bytes(std::span<const std::size_t>(&v.offset, 1)));
  }
  for (const auto& [name, buf] : all) {
    // Sharded parameters (ZeRO-3): each member holds its own shards of them only.
    if (name == "params" && shards_ != nullptr && shards_->parameters_sharded()) continue;
    add(std::as_bytes(buf));
  }
  std::int64_t cmp[2] = {static_cast<std::int64_t>(crc), -static_cast<std::int64_t>(crc)};
  backend.allreduce_sync(comm::Buffer::of(std::span<std::int64_t>(cmp)), comm::ReduceOp::kMax, op);
  if (cmp[0] != -cmp[1]) {
    SINEW_THROW(InternalError,
                "training state or the model's layout differs across ranks after synchronising from rank {}",
                root);
  }
  return seconds_since(t) * 1e3;
}

}  // namespace sinew::train
