#include "sinew/checkpoint/writer.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/checkpoint/schema.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/timer.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {

namespace {

using schema::crc32_of;
using schema::tensor_names;
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

/// The manifest, as a virtual dataset per tensor over the shard files (so h5py sees whole tensors).
void write_manifest(const std::string& path, const TrainingState& st, const std::vector<std::string>& names,
                    const std::vector<std::vector<std::uint32_t>>& crcs /* [rank][tensor] */,
                    const std::vector<h5::Digest>& files /* [rank] */) {
  const int world = st.world_size;
  h5::Handle f = h5::create_memory_file(path);
  write_meta(f.get(), st, names, path);
  std::vector<std::uint64_t> sizes;
  std::vector<std::uint32_t> file_crcs;
  for (const auto& d : files) {
    sizes.push_back(d.size);
    file_crcs.push_back(d.crc32);
  }
  h5::write_attr(f.get(), "shard_file_sizes", sizes, path);
  h5::write_attr(f.get(), "shard_file_crc32", file_crcs, path);
  for (std::size_t t = 0; t < names.size(); ++t) {
    const auto n = static_cast<std::uint64_t>(st.tensors.at(names[t]).size());
    const auto off = shard_offsets(n, world);
    std::vector<std::uint32_t> tensor_crcs(static_cast<std::size_t>(world));
    const hsize_t dims = n;
    h5::Handle vspace(H5Screate_simple(1, &dims, nullptr), H5Sclose);
    h5::Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    for (int r = 0; r < world; ++r) {
      tensor_crcs[static_cast<std::size_t>(r)] = crcs[static_cast<std::size_t>(r)][t];
      const hsize_t start = off[static_cast<std::size_t>(r)];
      const hsize_t count = off[static_cast<std::size_t>(r) + 1] - start;
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
  }
  const h5::Digest d = h5::write_image(f.get(), path, /*sync=*/true);
  // The manifest's own size and CRC32, in a one-line text file beside it: checked before HDF5 parses it.
  const std::string side = (fs::path(path).parent_path() / kManifestChecksumFile).string();
  {
    std::ofstream out(side, std::ios::trunc);
    out << fmt::format("{:08x} {}\n", d.crc32, d.size);
    out.flush();
    if (!out) SINEW_THROW(CheckpointError, "{}: cannot write (disk full?)", side);
  }
  h5::fsync_path(side, false);
}

/// Writes this rank's shard and makes it durable; returns the CRC32 of each tensor slice.
std::vector<std::uint32_t> write_shard(const std::string& path, const TrainingState& st,
                                       const std::vector<std::string>& names, int rank,
                                       const WriterOptions& o, std::uint64_t& bytes, h5::Digest& digest) {
  fault_point(o, fault::Point::kBeforeShardData, st.step);
  std::vector<std::uint32_t> crcs;
  {
    h5::Handle f = h5::create_memory_file(path);
    write_meta(f.get(), st, names, path);
    h5::write_attr(f.get(), "rank", static_cast<std::int64_t>(rank), path);
    for (const auto& name : names) {
      const auto& full = st.tensors.at(name);
      const auto off = shard_offsets(full.size(), st.world_size);
      const std::size_t begin = off[static_cast<std::size_t>(rank)];
      const std::size_t count = off[static_cast<std::size_t>(rank) + 1] - begin;
      h5::write_floats(f.get(), "tensors/" + name, full.data() + begin, count, path);
      crcs.push_back(crc32_of(full.data() + begin, count));
      bytes += count * sizeof(float);
    }
    digest = h5::write_image(f.get(), path, /*sync=*/false);
    fault_point(o, fault::Point::kAfterShardData, st.step);
  }
  fault_point(o, fault::Point::kBeforeFsync, st.step);
  h5::fsync_path(path, false);
  return crcs;
}

}  // namespace

struct Writer::Gathered {
  SaveResult res;
  std::vector<std::vector<std::uint32_t>> crcs;  // per rank, per tensor
  std::vector<h5::Digest> files;                 // per rank: shard file size and CRC32
};

Writer::Writer(std::string dir, comm::Backend& backend, WriterOptions opts)
    : dir_(std::move(dir)), backend_(backend), opts_(opts) {
  std::int64_t ok = 1;
  std::string why;
  if (backend_.rank() == 0) {
    try {
      fs::create_directories(dir_);
      for (const auto& e : fs::directory_iterator(dir_)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && step_of(n, /*partial=*/true)) fs::remove_all(e.path());
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

bool Writer::prepare(const TrainingState& state) {
  SINEW_ENFORCE_EQ(state.world_size, backend_.size(),
                   "TrainingState.world_size must be the writing group's size");
  const std::string final_dir = checkpoint_path(dir_, state.step);
  const std::string partial = partial_path(dir_, state.step);
  // Rank 0 prepares the .partial directory; everyone learns the outcome.
  std::int64_t prep = 0;  // 0 go, 1 already committed, 2 error
  std::string why;
  if (backend_.rank() == 0) {
    try {
      if (fs::exists(final_dir) && verify(final_dir).empty()) {
        prep = 1;  // this step is already committed and intact
      } else {
        // A damaged checkpoint of this step (resume fell back past it) is replaced, never kept.
        fs::remove_all(final_dir);
        fs::remove_all(partial);
        fs::create_directories(partial);
      }
    } catch (const fs::filesystem_error& e) {
      prep = 2;
      why = e.what();
    }
  }
  backend_.broadcast_sync(comm::Buffer::of(std::span<std::int64_t>(&prep, 1)), 0, opts_.op);
  if (prep == 2)
    SINEW_THROW(CheckpointError, "cannot create {}: {}", partial, why.empty() ? "see rank 0" : why);
  return prep == 0;
}

Writer::Local Writer::write_local(const TrainingState& state) const {
  const int rank = backend_.rank();
  const std::string partial = partial_path(dir_, state.step);
  Local out;
  try {
    h5::Digest digest;
    out.crcs = write_shard((fs::path(partial) / shard_name(rank, backend_.size())).string(), state,
                           tensor_names(state), rank, opts_, out.bytes, digest);
    out.file_size = digest.size;
    out.file_crc32 = digest.crc32;
    out.ok = true;
  } catch (const Error& e) {
    out.why = e.message();
  } catch (const std::exception& e) {
    out.why = e.what();
  }
  return out;
}

Writer::Gathered Writer::gather(const TrainingState& state, const Local& local, double write_ms) {
  const int world = backend_.size();
  const auto names = tensor_names(state);
  Gathered g;
  g.res.step = state.step;
  g.res.path = checkpoint_path(dir_, state.step);
  g.res.write_ms = write_ms;
  // Failures are agreed on, never left one-sided: every rank learns every rank's outcome and checksums.
  constexpr std::size_t kHead = 4;  // ok, bytes, shard file size, shard file crc; then a crc per tensor
  std::vector<std::uint64_t> mine(names.size() + kHead, 0);
  mine[0] = local.ok ? 1 : 0;
  mine[1] = local.bytes;
  mine[2] = local.file_size;
  mine[3] = local.file_crc32;
  std::copy(local.crcs.begin(), local.crcs.end(), mine.begin() + kHead);
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(world));
  backend_.allgather_sync(comm::Buffer::of(std::span<std::uint64_t>(mine)),
                          comm::Buffer::of(std::span<std::uint64_t>(all)), opts_.op);
  int failed = 0;
  g.crcs.resize(static_cast<std::size_t>(world));
  g.files.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::uint64_t* row = all.data() + mine.size() * static_cast<std::size_t>(r);
    if (row[0] != 1) ++failed;
    g.res.bytes += row[1];
    g.files[static_cast<std::size_t>(r)] = {row[2], static_cast<std::uint32_t>(row[3])};
    for (std::size_t t = 0; t < names.size(); ++t) {
      g.crcs[static_cast<std::size_t>(r)].push_back(static_cast<std::uint32_t>(row[kHead + t]));
    }
  }
  if (failed > 0) {
    if (backend_.rank() == 0) {
      std::error_code ec;
      fs::remove_all(partial_path(dir_, state.step), ec);
    }
    SINEW_THROW(CheckpointError,
                "checkpoint of step {} not written: {} of {} ranks failed to write their shard{}", state.step,
                failed, world, local.why.empty() ? std::string() : " (this rank: " + local.why + ")");
  }
  return g;
}

std::string Writer::commit_local(const TrainingState& state, const Gathered& g) const {
  const std::string partial = partial_path(dir_, state.step);
  std::string why;
  try {
    fault_point(opts_, fault::Point::kBeforeManifest, state.step);
    write_manifest((fs::path(partial) / kManifestFile).string(), state, tensor_names(state), g.crcs, g.files);
    h5::fsync_path(partial, true);
    fault_point(opts_, fault::Point::kBeforeRename, state.step);
    fs::rename(partial, g.res.path);
    h5::fsync_path(dir_, true);
  } catch (const Error& e) {
    why = e.message();
  } catch (const fs::filesystem_error& e) {
    why = e.what();
  }
  if (!why.empty()) {
    std::error_code ec;
    fs::remove_all(partial, ec);
    return why;
  }
  // Prune: keep the newest `keep` committed checkpoints.
  if (opts_.keep > 0) {
    auto entries = scan(dir_, /*check=*/false);
    for (std::size_t i = static_cast<std::size_t>(opts_.keep); i < entries.size(); ++i) {
      std::error_code ec;
      fs::remove_all(entries[i].path, ec);
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

SaveResult Writer::save(const TrainingState& state) {
  finish_async();
  const auto t0 = Clock::now();
  if (!prepare(state)) {
    SaveResult res;
    res.step = state.step;
    res.path = checkpoint_path(dir_, state.step);
    res.skipped = true;
    return res;
  }
  const Local local = write_local(state);
  Gathered g = gather(state, local, seconds_since(t0) * 1e3);
  const auto t1 = Clock::now();
  const std::string why = backend_.rank() == 0 ? commit_local(state, g) : std::string();
  g.res.commit_ms = seconds_since(t1) * 1e3;
  return announce(g.res, why);
}

bool Writer::save_async(TrainingState state) {
  finish_async();
  if (!prepare(state)) return false;
  auto job = std::make_unique<Async>();
  job->state = std::move(state);
  job->start = Clock::now();
  Async* j = job.get();
  job->thread = std::thread([this, j] {
    j->local = write_local(j->state);
    j->write_ms = seconds_since(j->start) * 1e3;
    j->done.store(true, std::memory_order_release);
  });
  async_ = std::move(job);
  return true;
}

std::optional<SaveResult> Writer::progress_async() {
  if (!async_) return std::nullopt;
  Async& j = *async_;
  if (j.thread.joinable()) j.thread.join();
  if (!j.gathered) {
    // Every shard is durable: rank 0 writes the manifest and renames in the background, so its fsyncs
    // stay off the training thread. The others learn the outcome at the next call.
    try {
      j.gathered = std::make_unique<Gathered>(gather(j.state, j.local, j.write_ms));
    } catch (...) {
      async_.reset();
      throw;
    }
    if (backend_.rank() == 0) {
      j.done.store(false, std::memory_order_release);
      j.commit_start = Clock::now();
      j.thread = std::thread([this, &j] {
        j.why = commit_local(j.state, *j.gathered);
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
  // A write still in flight finishes its local part; without the collective commit it stays .partial
  // and is never loaded (the next Writer on this directory removes it). A commit in flight on rank 0
  // completes: every shard of it is already durable.
  if (async_ && async_->thread.joinable()) async_->thread.join();
}

}  // namespace sinew::checkpoint
