#include "sinew/checkpoint/writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <numeric>
#include <system_error>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/checkpoint/schema.hpp"
#include "sinew/checkpoint/views.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {

namespace {

using schema::write_meta;

/// Element offsets of a tensor of `n` elements split over `world` ranks in contiguous, balanced slices.
std::vector<std::uint64_t> shard_offsets(std::uint64_t n, int world) {
  std::vector<std::uint64_t> off(static_cast<std::size_t>(world) + 1);
  for (int r = 0; r <= world; ++r)
    off[static_cast<std::size_t>(r)] = n * static_cast<std::uint64_t>(r) / static_cast<std::uint64_t>(world);
  return off;
}

/// A fault injection point of the plan, if any (core/fault.hpp).
void fault_point(const WriterOptions& o, fault::Point point, std::int64_t step) {
  if (o.faults != nullptr) o.faults->at(point, step);
}

/// Empties the directory of a failed attempt but keeps it: its name stays taken, so that no later attempt
/// reuses it (a name reused on a distributed filesystem can show the old entries to a client that looked
/// them up before).
void abandon(const std::string& path) {
  std::error_code ec;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code rec;
    fs::remove_all(it->path(), rec);
  }
}

/// Creates `path` with an exclusive create, writes `text` and syncs it.
void create_exclusive(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    SINEW_THROW(CheckpointError, "{}: cannot create: {}", path, std::generic_category().message(errno));
  const ssize_t w = ::write(fd, text.data(), text.size());
  const int err = errno;
  const bool ok = w == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    SINEW_THROW(CheckpointError, "{}: cannot write the commit record: {}", path,
                w < 0 ? std::generic_category().message(err) : std::string("short write (disk full?)"));
  }
}

}  // namespace

/// What one save writes, and where.
struct Writer::Plan {
  TrainingState meta;                // every field but tensors
  std::vector<std::string> names;    // tensor names, in name order (the manifest's)
  std::vector<std::uint64_t> sizes;  // whole tensors' sizes, same order
  std::string path;                  // the checkpoint directory of this attempt
};

/// This rank's shard file, built in memory.
struct Writer::Shard {
  h5::Image image;
  std::vector<std::uint64_t> offsets;  // per tensor: byte offset of this rank's slice in the file
  std::vector<std::uint64_t> bytes;    // per tensor: its length in bytes
  /// Streamed (a save in the foreground): per tensor, the state's slice itself, which is written from there;
  /// the image holds zeros in its place. Empty: the image holds the data (a background save's snapshot).
  std::vector<const float*> from;
};

Writer::Async::Async() = default;
Writer::Async::~Async() = default;

struct Writer::Gathered {
  SaveResult res;
  std::vector<std::vector<std::uint32_t>> crcs;     // per rank, per tensor
  std::vector<std::vector<std::uint64_t>> offsets;  // per rank, per tensor: byte offset in the shard
  std::vector<h5::Digest> files;                    // per rank: shard file size and CRC32
};

namespace {

/// The manifest: the run's metadata, where every tensor slice lies and its checksums, and a virtual
/// dataset per tensor over the shard files (so h5py sees whole tensors). Returns its digest.
h5::Digest write_manifest(const std::string& path, const TrainingState& st,
                          const std::vector<std::string>& names, const std::vector<std::uint64_t>& sizes,
                          const std::vector<std::vector<std::uint32_t>>& crcs /* [rank][tensor] */,
                          const std::vector<std::vector<std::uint64_t>>& data_offsets /* [rank][tensor] */,
                          const std::vector<h5::Digest>& files /* [rank] */) {
  const int world = st.world_size;
  h5::MemoryFile f(path);
  write_meta(f.get(), st, names, path);
  std::vector<std::uint64_t> file_sizes;
  std::vector<std::uint32_t> file_crcs;
  for (const auto& d : files) {
    file_sizes.push_back(d.size);
    file_crcs.push_back(d.crc32);
  }
  h5::write_attr(f.get(), "shard_file_sizes", file_sizes, path);
  h5::write_attr(f.get(), "shard_file_crc32", file_crcs, path);
  for (std::size_t t = 0; t < names.size(); ++t) {
    const std::uint64_t n = sizes[t];
    const auto off = shard_offsets(n, world);
    std::vector<std::uint32_t> tensor_crcs(static_cast<std::size_t>(world));
    std::vector<std::uint64_t> tensor_data(static_cast<std::size_t>(world));
    const hsize_t dims = n;
    h5::Handle vspace(H5Screate_simple(1, &dims, nullptr), H5Sclose);
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    for (int r = 0; r < world; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      tensor_crcs[ri] = crcs[ri][t];
      tensor_data[ri] = data_offsets[ri][t];
      const hsize_t start = off[ri];
      const hsize_t count = off[ri + 1] - start;
      if (count == 0) continue;
      h5::Handle sel(H5Scopy(vspace.get()), H5Sclose);
      H5Sselect_hyperslab(sel.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr);
      h5::Handle src(H5Screate_simple(1, &count, nullptr), H5Sclose);
      // Relative source names resolve against the manifest's own directory.
      if (H5Pset_virtual(dcpl.get(), sel.get(), shard_name(r, world).c_str(),
                         ("/tensors/" + names[t]).c_str(), src.get()) < 0) {
        SINEW_THROW(CheckpointError, "{}: cannot map tensor {} to its shards", path, names[t]);
      }
    }
    h5::Handle ds(H5Dcreate2(f.get(), ("tensors/" + names[t]).c_str(), H5T_IEEE_F32LE, vspace.get(),
                             h5::intermediate_groups().get(), dcpl.get(), H5P_DEFAULT),
                  H5Dclose);
    if (ds.get() < 0)
      SINEW_THROW(CheckpointError, "{}: cannot create virtual dataset for {}", path, names[t]);
    h5::write_attr(ds.get(), "size", n, path);
    h5::write_attr(ds.get(), "shard_offsets", off, path);
    h5::write_attr(ds.get(), "shard_crc32", tensor_crcs, path);
    h5::write_attr(ds.get(), "shard_data_offsets", tensor_data, path);
  }
  std::map<std::string, std::uint64_t> tensor_sizes;
  for (std::size_t t = 0; t < names.size(); ++t) tensor_sizes[names[t]] = sizes[t];
  write_views(f.get(), st.views, tensor_sizes, path, st.model_json);
  return h5::write_image(f, path, /*sync=*/true);
}

}  // namespace

Writer::Writer(std::string dir, comm::Backend& backend, WriterOptions opts)
    : dir_(std::move(dir)), backend_(backend), opts_(opts) {
  std::int64_t ok = 1;
  std::string why;
  if (backend_.rank() == 0) {
    try {
      fs::create_directories(dir_);
      for (const auto& e : scan_uncommitted(dir_)) {
        if (const auto n = parse_name(fs::path(e.path).filename().string()); n && n->partial)
          fs::remove_all(e.path);
      }
    } catch (const fs::filesystem_error& e) {
      ok = 0;
      why = e.what();
    }
  }
  backend_.broadcast_sync(comm::Buffer::of(std::span<std::int64_t>(&ok, 1)), 0, opts_.op);
  if (!ok) {
    SINEW_THROW(CheckpointError, "--checkpoint-dir {}: cannot use it: {}", dir_,
                why.empty() ? "rank 0 could not create or clean it" : why);
  }
}

std::unique_ptr<Writer::Plan> Writer::prepare(const StateRef& state) {
  SINEW_ENFORCE_EQ(state.meta.world_size, backend_.size(),
                   "TrainingState.world_size must be the writing group's size");
  // Rank 0 picks a directory name never used before and creates it; everyone learns the outcome.
  std::int64_t prep[2] = {0, 1};  // {0 go, 1 already committed, 2 error; attempt}
  std::string why;
  if (backend_.rank() == 0) {
    try {
      for (int attempt = 1;; ++attempt) {
        const std::string path = checkpoint_path(dir_, state.meta.step, attempt);
        std::error_code ec;
        if (fs::create_directory(path, ec)) {
          prep[1] = attempt;
          break;
        }
        // EEXIST for a name that then does not exist: GlusterFS, when another client looks the name up
        // during the mkdir. The name is given up like a taken one.
        if (ec && ec != std::errc::file_exists) throw fs::filesystem_error("cannot create", path, ec);
        if (attempt >= 1000) throw fs::filesystem_error("1000 attempts at this step", path, ec);
        // Taken: by a committed checkpoint of this step that is intact (nothing to do), or by one that
        // is damaged or a failed attempt (a resume fell back past it): the next name is tried.
        if (is_committed(path) && verify(path).empty()) {
          prep[0] = 1;
          prep[1] = attempt;
          break;
        }
      }
    } catch (const fs::filesystem_error& e) {
      prep[0] = 2;
      why = e.what();
    }
  }
  backend_.broadcast_sync(comm::Buffer::of(std::span<std::int64_t>(prep, 2)), 0, opts_.op);
  const std::string path = checkpoint_path(dir_, state.meta.step, static_cast<int>(prep[1]));
  if (prep[0] == 2)
    SINEW_THROW(CheckpointError, "cannot create {}: {}", path, why.empty() ? "see rank 0" : why);
  if (prep[0] == 1) return nullptr;
  auto plan = std::make_unique<Plan>();
  plan->meta = state.meta;
  plan->path = path;
  for (const auto& [name, ref] : state.tensors) {
    plan->names.push_back(name);
    plan->sizes.push_back(ref.whole > 0  ? ref.whole
                          : ref.per_rank ? ref.data.size() * static_cast<std::uint64_t>(backend_.size())
                                         : ref.data.size());
  }
  // The names are checked like a TrainingState's (no empty names, no newlines, no leading '/').
  TrainingState names_only;
  for (const auto& n : plan->names) names_only.tensors[n];
  schema::tensor_names(names_only);
  return plan;
}

std::unique_ptr<Writer::Shard> Writer::build(const Plan& plan, const StateRef& state, bool streamed) const {
  const int rank = backend_.rank(), world = backend_.size();
  const std::string file = (fs::path(plan.path) / shard_name(rank, world)).string();
  auto shard = std::make_unique<Shard>();
  std::size_t bytes = 0;
  std::vector<std::pair<const float*, std::size_t>> slices;
  for (std::size_t t = 0; t < plan.names.size(); ++t) {
    const TensorRef& ref = state.tensors.at(plan.names[t]);
    const auto off = shard_offsets(plan.sizes[t], world);
    const std::size_t begin = off[static_cast<std::size_t>(rank)];
    const std::size_t count = off[static_cast<std::size_t>(rank) + 1] - begin;
    // A per-rank tensor's slice for this rank is exactly this rank's block (its size is world x block).
    SINEW_ENFORCE(!ref.per_rank || count == ref.data.size(),
                  "per-rank tensor blocks must have the same size");
    // A rank's own slice of a whole tensor (a sharded state) is exactly its slice.
    SINEW_ENFORCE(ref.whole == 0 || count == ref.data.size(),
                  "tensor {}: a slice of {} elements, {} expected", plan.names[t], ref.data.size(), count);
    slices.emplace_back(ref.per_rank || ref.whole > 0 ? ref.data.data() : ref.data.data() + begin, count);
    bytes += count * sizeof(float);
  }
  h5::Image recycled;
  if (!streamed) {
    const std::lock_guard lock(spare_mutex_);
    if (spare_) recycled = std::move(spare_->image);
  }
  h5::MemoryFile f(file, bytes, std::move(recycled));
  write_meta(f.get(), plan.meta, plan.names, file);
  h5::write_attr(f.get(), "rank", static_cast<std::int64_t>(rank), file);
  for (std::size_t t = 0; t < plan.names.size(); ++t) {
    const auto [data, count] = slices[t];
    const std::string name = "tensors/" + plan.names[t];
    shard->offsets.push_back(streamed ? f.pass_floats(name, data, count)
                                      : h5::write_floats(f.get(), name, data, count, file));
    shard->bytes.push_back(count * sizeof(float));
    if (streamed) shard->from.push_back(data);
  }
  shard->image = f.take();
  return shard;
}

Writer::Local Writer::write_local(const Plan& plan, Shard& shard) const {
  const std::string file = (fs::path(plan.path) / shard_name(backend_.rank(), backend_.size())).string();
  Local out;
  try {
    fault_point(opts_, fault::Point::kBeforeShardData, plan.meta.step);
    // One pass of CRC32 over the file: the tensor slices' CRC32s are computed on their own and combined
    // with the bytes between them into the whole file's. A streamed shard's slices come from the state,
    // the bytes between them from the image.
    const std::byte* img = reinterpret_cast<const std::byte*>(shard.image.data.get());
    const std::size_t size = shard.image.size;
    const bool streamed = !shard.from.empty();
    std::vector<std::size_t> order(plan.names.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](std::size_t a, std::size_t b) { return shard.offsets[a] < shard.offsets[b]; });
    out.crcs.assign(plan.names.size(), 0);
    std::vector<std::span<const std::byte>> pieces;
    std::uint32_t crc = 0;
    std::uint64_t pos = 0;
    for (const std::size_t t : order) {
      if (shard.bytes[t] == 0) continue;
      crc = h5::crc32_bytes(img + pos, shard.offsets[t] - pos, crc);
      const std::byte* data =
          streamed ? reinterpret_cast<const std::byte*>(shard.from[t]) : img + shard.offsets[t];
      out.crcs[t] = h5::crc32_bytes(data, shard.bytes[t]);
      crc = h5::crc32_combine(crc, out.crcs[t], shard.bytes[t]);
      pieces.emplace_back(img + pos, shard.offsets[t] - pos);
      pieces.emplace_back(data, shard.bytes[t]);
      pos = shard.offsets[t] + shard.bytes[t];
    }
    crc = h5::crc32_bytes(img + pos, size - pos, crc);
    pieces.emplace_back(img + pos, size - pos);
    h5::write_file(file, pieces, /*sync=*/false);
    fault_point(opts_, fault::Point::kAfterShardData, plan.meta.step);
    fault_point(opts_, fault::Point::kBeforeFsync, plan.meta.step);
    h5::fsync_path(file, false);
    out.bytes = std::accumulate(shard.bytes.begin(), shard.bytes.end(), std::uint64_t{0});
    out.data_offsets = shard.offsets;
    out.file_size = size;
    out.file_crc32 = crc;
    out.ok = true;
  } catch (const Error& e) {
    out.why = e.message();
  } catch (const std::exception& e) {
    out.why = e.what();
  }
  // The memory is kept for the next shard (one block: a later, larger state allocates anew). A streamed
  // shard's block is the metadata's: too small to keep.
  if (!shard.from.empty()) return out;
  auto spare = std::make_unique<Shard>();
  spare->image = std::move(shard.image);
  const std::lock_guard lock(spare_mutex_);
  spare_ = std::move(spare);
  return out;
}

Writer::Gathered Writer::gather(const Plan& plan, const Local& local, double write_ms) {
  const int world = backend_.size();
  const std::size_t nt = plan.names.size();
  Gathered g;
  g.res.step = plan.meta.step;
  g.res.path = plan.path;
  g.res.write_ms = write_ms;
  // Failures are agreed on, never left one-sided: every rank learns every rank's outcome and checksums.
  // Row: ok, bytes, shard file size, shard file crc; a crc per tensor; a data offset per tensor.
  constexpr std::size_t kHead = 4;
  std::vector<std::uint64_t> mine(kHead + 2 * nt, 0);
  mine[0] = local.ok ? 1 : 0;
  mine[1] = local.bytes;
  mine[2] = local.file_size;
  mine[3] = local.file_crc32;
  if (local.ok) {
    std::copy(local.crcs.begin(), local.crcs.end(), mine.begin() + kHead);
    std::copy(local.data_offsets.begin(), local.data_offsets.end(),
              mine.begin() + static_cast<std::ptrdiff_t>(kHead + nt));
  }
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(world));
  backend_.allgather_sync(comm::Buffer::of(std::span<std::uint64_t>(mine)),
                          comm::Buffer::of(std::span<std::uint64_t>(all)), opts_.op);
  int failed = 0;
  g.crcs.resize(static_cast<std::size_t>(world));
  g.offsets.resize(static_cast<std::size_t>(world));
  g.files.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::uint64_t* row = all.data() + mine.size() * ri;
    if (row[0] != 1) ++failed;
    g.res.bytes += row[1];
    g.files[ri] = {row[2], static_cast<std::uint32_t>(row[3])};
    for (std::size_t t = 0; t < nt; ++t) {
      g.crcs[ri].push_back(static_cast<std::uint32_t>(row[kHead + t]));
      g.offsets[ri].push_back(row[kHead + nt + t]);
    }
  }
  if (failed > 0) {
    if (backend_.rank() == 0) abandon(plan.path);
    SINEW_THROW(
        CheckpointError, "checkpoint of step {} not written: {} of {} ranks failed to write their shard{}",
        plan.meta.step, failed, world, local.why.empty() ? std::string() : " (this rank: " + local.why + ")");
  }
  return g;
}

std::string Writer::commit_local(const Plan& plan, const Gathered& g) const {
  std::string why;
  try {
    fault_point(opts_, fault::Point::kBeforeManifest, plan.meta.step);
    const h5::Digest d = write_manifest((fs::path(plan.path) / kManifestFile).string(), plan.meta, plan.names,
                                        plan.sizes, g.crcs, g.offsets, g.files);
    h5::fsync_path(plan.path, true);
    fault_point(opts_, fault::Point::kBeforeCommit, plan.meta.step);
    // The commit: the record is created last, exclusively, and synced with its directory.
    create_exclusive((fs::path(plan.path) / kCommitFile).string(),
                     fmt::format("{} {:08x} {}\n", kManifestFile, d.crc32, d.size));
    h5::fsync_path(plan.path, true);
  } catch (const Error& e) {
    why = e.message();
  } catch (const fs::filesystem_error& e) {
    why = e.what();
  }
  if (!why.empty()) {
    abandon(plan.path);
    return why;
  }
  // Prune: keep the newest `keep` committed checkpoints that pass a quick check (manifest intact, every
  // shard file present with its size), and everything newer than the oldest of them; remove what is
  // older. A checkpoint newer than the newest good one is never removed.
  if (opts_.keep > 0) {
    int good = 0;
    std::int64_t oldest_kept = -1;
    for (const auto& e : scan(dir_, /*check=*/false)) {
      if (quick_check(e.path).empty() && ++good == opts_.keep) {
        oldest_kept = e.step;
        break;
      }
    }
    if (oldest_kept >= 0) {
      auto older = scan(dir_, /*check=*/false);
      const auto uncommitted = scan_uncommitted(dir_);
      older.insert(older.end(), uncommitted.begin(), uncommitted.end());
      for (const auto& e : older) {
        std::error_code ec;
        if (e.step < oldest_kept) fs::remove_all(e.path, ec);
      }
    }
  }
  return {};
}

SaveResult Writer::announce(SaveResult res, const std::string& why) {
  std::int64_t committed = backend_.rank() != 0 || why.empty() ? 1 : 0;
  backend_.broadcast_sync(comm::Buffer::of(std::span<std::int64_t>(&committed, 1)), 0, opts_.op);
  if (!committed) {
    SINEW_THROW(CheckpointError, "checkpoint of step {} not committed: {}", res.step,
                why.empty() ? "rank 0 could not write the manifest" : why);
  }
  return res;
}

SaveResult Writer::save(const TrainingState& state) { return save(ref_of(state)); }

SaveResult Writer::save(const StateRef& state) {
  finish_async();
  const auto t0 = Clock::now();
  const auto plan = prepare(state);
  if (!plan) {
    SaveResult res;
    res.step = state.meta.step;
    res.path = checkpoint_path(dir_, state.meta.step);
    res.skipped = true;
    return res;
  }
  Local local;
  try {
    auto shard = build(*plan, state, /*streamed=*/true);  // (the state holds still until save() returns)
    local = write_local(*plan, *shard);
  } catch (const Error& e) {
    local.why = e.message();
  }
  Gathered g = gather(*plan, local, seconds_since(t0) * 1e3);
  const auto t1 = Clock::now();
  const std::string why = backend_.rank() == 0 ? commit_local(*plan, g) : std::string();
  g.res.commit_ms = seconds_since(t1) * 1e3;
  return announce(g.res, why);
}

bool Writer::save_async(const StateRef& state) {
  finish_async();
  auto plan = prepare(state);
  if (!plan) return false;
  auto job = std::make_unique<Async>();
  job->start = Clock::now();
  try {
    job->shard = build(*plan, state, /*streamed=*/false);  // the image is the snapshot
  } catch (const Error& e) {
    job->local.why = e.message();  // reported at the gather, on every rank
  }
  job->plan = std::move(plan);
  Async* j = job.get();
  if (j->shard) {
    job->thread = std::thread([this, j] {
      j->local = write_local(*j->plan, *j->shard);
      j->write_ms = seconds_since(j->start) * 1e3;
      j->done.store(true, std::memory_order_release);
    });
  } else {
    j->done.store(true, std::memory_order_release);
  }
  async_ = std::move(job);
  return true;
}

std::optional<SaveResult> Writer::progress_async() {
  if (!async_) return std::nullopt;
  Async& j = *async_;
  if (j.thread.joinable()) j.thread.join();
  if (!j.gathered) {
    // Every shard is durable: rank 0 writes the manifest and the commit record in the background, so its
    // fsyncs stay off the training thread. The others learn the outcome at the next call.
    try {
      j.gathered = std::make_unique<Gathered>(gather(*j.plan, j.local, j.write_ms));
    } catch (...) {
      async_.reset();
      throw;
    }
    if (backend_.rank() == 0) {
      j.done.store(false, std::memory_order_release);
      j.commit_start = Clock::now();
      j.thread = std::thread([this, &j] {
        j.why = commit_local(*j.plan, *j.gathered);
        j.commit_ms = seconds_since(j.commit_start) * 1e3;
        j.done.store(true, std::memory_order_release);
      });
    }
    return std::nullopt;
  }
  auto job = std::move(async_);
  SaveResult res = job->gathered->res;
  res.commit_ms = job->commit_ms;
  return announce(res, job->why);
}

std::optional<SaveResult> Writer::finish_async() {
  std::optional<SaveResult> res;
  while (async_) res = progress_async();
  return res;
}

Writer::~Writer() {
  // A write still in flight finishes its local part; without the collective commit it has no commit
  // record and is never loaded. A commit in flight on rank 0 completes: every shard of it is durable.
  if (async_ && async_->thread.joinable()) async_->thread.join();
}

}  // namespace sinew::checkpoint
