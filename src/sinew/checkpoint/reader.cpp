#include "sinew/checkpoint/reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <system_error>
#include <thread>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/checkpoint/schema.hpp"
#include "sinew/checkpoint/views.hpp"
#include "sinew/core/error.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_in(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, seconds)));
}

/// Whether `path` exists; a distributed filesystem's transient "no such file" (ENOENT, ESTALE) is waited
/// out until `deadline`.
bool present(const fs::path& path, Clock::time_point deadline) {
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    std::error_code ec;
    if (fs::exists(path, ec)) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

void require_present(const fs::path& path, Clock::time_point deadline, const char* what) {
  if (!present(path, deadline)) {
    SINEW_THROW(CheckpointError,
                "{}: {} is missing (the checkpoint's records name it; on a distributed filesystem its "
                "storage server may be unreachable)",
                path.string(), what);
  }
}

/// Reads a commit record, "manifest.h5 <crc32> <size>\n", or an earlier version's manifest.h5.crc32,
/// "<crc32> <size>\n". A commit record is created before it is written: an empty one is waited for until
/// `deadline`, then it is an incomplete commit.
h5::Digest read_record(const fs::path& file, bool commit_record, Clock::time_point deadline) {
  std::string text;
  auto pause = std::chrono::milliseconds(5);
  for (;;) {
    std::ifstream in(file);
    if (!in) SINEW_THROW(CheckpointError, "{}: missing (not a committed checkpoint)", file.string());
    text.assign(96, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(in.gcount()));
    if (!text.empty() || !commit_record || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  static const std::regex kCommit(R"(manifest\.h5 ([0-9a-f]{8}) ([0-9]{1,15})\n?)");
  static const std::regex kLegacy(R"(([0-9a-f]{8}) ([0-9]{1,15})\n?)");
  std::smatch m;
  if (text.empty()) {
    SINEW_THROW(CheckpointError, "{}: the commit record is empty: the commit was cut short", file.string());
  }
  if (!std::regex_match(text, m, commit_record ? kCommit : kLegacy)) {
    SINEW_THROW(CheckpointError, "{}: corrupt (expected '{}<crc32> <size>')", file.string(),
                commit_record ? "manifest.h5 " : "");
  }
  return {std::stoull(m[2].str()), static_cast<std::uint32_t>(std::stoul(m[1].str(), nullptr, 16))};
}

/// The checkpoint directory of `path`: itself, or the directory of a manifest.h5 path.
fs::path dir_of(const std::string& path) {
  fs::path dir = path;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) dir = dir.parent_path();
  return dir;
}

std::string errno_text(int err) { return std::generic_category().message(err); }

/// Reads exactly `n` bytes of `fd` into `out`; throws naming `file` for an error or a short file.
void read_exact(int fd, void* out, std::size_t n, const std::string& file) {
  auto* p = static_cast<char*>(out);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) SINEW_THROW(CheckpointError, "{}: read failed: {}", file, errno_text(errno));
    if (r == 0) SINEW_THROW(CheckpointError, "{}: ends early: the file is truncated", file);
    got += static_cast<std::size_t>(r);
  }
}

/// Closes a file descriptor at scope exit.
struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&&) = delete;
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

/// Opens a shard file and checks that it has the size its checkpoint records.
int open_shard(const std::string& file, std::uint64_t size) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) SINEW_THROW(CheckpointError, "{}: cannot open: {}", file, errno_text(errno));
  struct stat sb {};
  if (::fstat(fd, &sb) != 0 || static_cast<std::uint64_t>(sb.st_size) != size) {
    ::close(fd);
    SINEW_THROW(CheckpointError,
                "{}: has {} bytes, its checkpoint records {}: the file is truncated or damaged", file,
                static_cast<long long>(sb.st_size), size);
  }
  return fd;
}

/// Schema 2: reads shard `r`'s file once, front to back: each tensor slice straight into `st`, the bytes
/// between them (HDF5's metadata) into a scratch buffer; the whole file's CRC32 is combined from the
/// pieces' and compared with the manifest's.
void read_shard(const std::string& file, const ManifestInfo& info, std::size_t r, TrainingState& st) {
  struct Piece {
    std::uint64_t offset, bytes;
    float* dest;
    const ManifestInfo::Tensor* tensor;
  };
  const std::uint64_t size = info.shard_file_sizes[r];
  std::vector<Piece> pieces;
  for (const auto& t : info.tensors) {
    const std::uint64_t begin = t.shard_offsets[r], count = t.shard_offsets[r + 1] - begin;
    if (count == 0) continue;
    pieces.push_back({t.shard_data_offsets[r], count * sizeof(float), st.tensors[t.name].data() + begin, &t});
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  std::uint64_t end = 0;
  for (const auto& p : pieces) {
    if (p.offset < end || p.bytes > size || p.offset > size - p.bytes) {
      SINEW_THROW(CheckpointError, "{}: the manifest places tensor '{}' outside the file or over another",
                  file, p.tensor->name);
    }
    end = p.offset + p.bytes;
  }
  Fd fd{open_shard(file, size)};
  ::posix_fadvise(fd.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> scratch;
  std::uint32_t crc = 0;
  std::uint64_t pos = 0;
  const ManifestInfo::Tensor* bad = nullptr;
  std::uint32_t bad_crc = 0;
  auto skip_to = [&](std::uint64_t to) {  // the bytes up to `to`: HDF5's metadata, checked, not kept
    scratch.resize(static_cast<std::size_t>(to - pos));
    read_exact(fd.fd, scratch.data(), scratch.size(), file);
    crc = h5::crc32_bytes(scratch.data(), scratch.size(), crc);
    pos = to;
  };
  for (const auto& p : pieces) {
    skip_to(p.offset);
    read_exact(fd.fd, p.dest, static_cast<std::size_t>(p.bytes), file);
    const std::uint32_t piece_crc = h5::crc32_bytes(p.dest, static_cast<std::size_t>(p.bytes));
    crc = h5::crc32_combine(crc, piece_crc, p.bytes);
    if (piece_crc != p.tensor->shard_crc32[r] && bad == nullptr) {
      bad = p.tensor;
      bad_crc = piece_crc;
    }
    pos += p.bytes;
  }
  skip_to(size);
  char extra = 0;
  if (::read(fd.fd, &extra, 1) > 0)
    SINEW_THROW(CheckpointError, "{}: is longer than the {} bytes its checkpoint records", file, size);
  if (bad != nullptr) {
    SINEW_THROW(
        CheckpointError,
        "{}: tensor '{}' fails its CRC32 check (manifest 0x{:08x}, data 0x{:08x}): the shard is corrupt",
        file, bad->name, bad->shard_crc32[r], bad_crc);
  }
  if (crc != info.shard_file_crc32[r]) {
    SINEW_THROW(CheckpointError,
                "{}: fails its CRC32 check (expected 0x{:08x}, file 0x{:08x}): the file is corrupt", file,
                info.shard_file_crc32[r], crc);
  }
}

/// Schema 1: the whole shard file checked, then parsed by HDF5, then each tensor slice checked.
void read_shard_v1(const std::string& file, const ManifestInfo& info, std::size_t r, TrainingState& st) {
  const auto f = h5::open_verified(file, {info.shard_file_sizes[r], info.shard_file_crc32[r]});
  const int world = info.meta.world_size;
  if (h5::read_attr_i64(f.get(), "rank", file) != static_cast<std::int64_t>(r) ||
      h5::read_attr_i64(f.get(), "step", file) != info.meta.step ||
      h5::read_attr_i64(f.get(), "world_size", file) != world) {
    SINEW_THROW(CheckpointError, "{}: shard belongs to another checkpoint (rank, step or world size differ)",
                file);
  }
  for (const auto& t : info.tensors) {
    const std::size_t begin = t.shard_offsets[r], count = t.shard_offsets[r + 1] - begin;
    float* out = st.tensors[t.name].data() + begin;
    h5::read_floats(f.get(), "tensors/" + t.name, out, count, file);
    const std::uint32_t crc = schema::crc32_of(out, count);
    if (crc != t.shard_crc32[r]) {
      SINEW_THROW(
          CheckpointError,
          "{}: tensor '{}' fails its CRC32 check (manifest 0x{:08x}, data 0x{:08x}): the shard is corrupt",
          file, t.name, t.shard_crc32[r], crc);
    }
  }
}

}  // namespace

ManifestInfo read_manifest(const std::string& path, const LoadOptions& options) {
  const auto deadline = deadline_in(options.retry_s);
  if (!present(path, deadline)) SINEW_THROW(CheckpointError, "{}: no such checkpoint", path);
  const fs::path dir = dir_of(path);
  const std::string file = (dir / kManifestFile).string();
  if (const auto n = parse_name(dir.filename().string()); n && n->partial) {
    SINEW_THROW(CheckpointError,
                "{}: an unfinished write of an earlier Sinew version (.partial): never loaded", dir.string());
  }
  ManifestInfo info;
  h5::Digest digest;
  std::error_code ec;
  if (fs::exists(dir / kCommitFile, ec)) {
    digest = read_record(dir / kCommitFile, /*commit_record=*/true, deadline);
  } else if (fs::exists(dir / kManifestChecksumFile, ec)) {
    digest = read_record(dir / kManifestChecksumFile, /*commit_record=*/false, deadline);
    info.legacy_commit = true;
  } else {
    SINEW_THROW(CheckpointError,
                "{}: not committed (no {} record): a write in progress, abandoned or failed{}", dir.string(),
                kCommitFile, fs::exists(file, ec) ? "" : "; its manifest is missing");
  }
  require_present(file, deadline, "the manifest");
  const auto f = h5::open_verified(file, digest);
  info.schema_version = static_cast<int>(h5::read_attr_i64(f.get(), "schema_version", file));
  if (info.schema_version < 1 || info.schema_version > kSchemaVersion) {
    SINEW_THROW(CheckpointError, "{}: schema version {} is not supported (this Sinew reads versions 1 to {})",
                file, info.schema_version, kSchemaVersion);
  }
  info.meta = schema::read_meta(f.get(), file);
  info.shard_file_sizes = h5::read_attr_u64s(f.get(), "shard_file_sizes", file);
  info.shard_file_crc32 = h5::read_attr_u32s(f.get(), "shard_file_crc32", file);
  if (const auto named = step_of(dir.filename().string()); named && *named != info.meta.step) {
    SINEW_THROW(CheckpointError, "{}: manifest is for step {} but the directory says step {}", file,
                info.meta.step, *named);
  }
  if (info.meta.world_size < 1 || info.meta.world_size > (1 << 20)) {
    SINEW_THROW(CheckpointError, "{}: implausible world size {}", file, info.meta.world_size);
  }
  const auto w = static_cast<std::size_t>(info.meta.world_size);
  if (info.shard_file_sizes.size() != w || info.shard_file_crc32.size() != w) {
    SINEW_THROW(CheckpointError, "{}: shard file sizes/checksums do not match the world size", file);
  }
  for (const auto& name : schema::read_tensor_names(f.get(), file)) {
    const std::string ds_name = "tensors/" + name;
    if (H5Lexists(f.get(), "tensors", H5P_DEFAULT) <= 0 ||
        H5Lexists(f.get(), ds_name.c_str(), H5P_DEFAULT) <= 0) {
      SINEW_THROW(CheckpointError, "{}: tensor '{}' is listed but missing", file, name);
    }
    h5::Handle ds(H5Dopen2(f.get(), ds_name.c_str(), H5P_DEFAULT), H5Dclose);
    if (ds.get() < 0) SINEW_THROW(CheckpointError, "{}: cannot open tensor '{}'", file, name);
    ManifestInfo::Tensor t;
    t.name = name;
    t.size = h5::read_attr_u64(ds.get(), "size", file);
    t.shard_offsets = h5::read_attr_u64s(ds.get(), "shard_offsets", file);
    t.shard_crc32 = h5::read_attr_u32s(ds.get(), "shard_crc32", file);
    if (info.schema_version >= 2)
      t.shard_data_offsets = h5::read_attr_u64s(ds.get(), "shard_data_offsets", file);
    if (t.shard_offsets.size() != w + 1 || t.shard_crc32.size() != w || t.shard_offsets.front() != 0 ||
        t.shard_offsets.back() != t.size || !std::is_sorted(t.shard_offsets.begin(), t.shard_offsets.end()) ||
        (info.schema_version >= 2 && t.shard_data_offsets.size() != w)) {
      SINEW_THROW(CheckpointError, "{}: tensor '{}' has inconsistent shard offsets or checksums", file, name);
    }
    info.tensors.push_back(std::move(t));
  }
  auto mv = read_views(f.get(), file);
  info.meta.views = std::move(mv.views);
  info.meta.model_json = std::move(mv.model_json);
  return info;
}

TrainingState load(const std::string& path, const LoadOptions& options) {
  const ManifestInfo info = read_manifest(path, options);
  const fs::path dir = dir_of(path);
  const auto deadline = deadline_in(options.retry_s);
  TrainingState st = info.meta;
  for (const auto& t : info.tensors) st.tensors[t.name].resize(t.size);
  const int world = info.meta.world_size;
  for (int r = 0; r < world; ++r) {
    const std::string file = (dir / shard_name(r, world)).string();
    require_present(file, deadline, "shard file");
    if (info.schema_version >= 2)
      read_shard(file, info, static_cast<std::size_t>(r), st);
    else
      read_shard_v1(file, info, static_cast<std::size_t>(r), st);
  }
  return st;
}

ManifestInfo load_into(const std::string& path, const std::vector<ReadTarget>& targets,
                       const LoadOptions& options) {
  ManifestInfo info = read_manifest(path, options);
  const auto find = [&](const std::string& name) -> const ManifestInfo::Tensor& {
    for (const auto& t : info.tensors)
      if (t.name == name) return t;
    SINEW_THROW(CheckpointError, "{}: has no tensor '{}'", path, name);
  };
  for (const auto& target : targets) {
    const auto& t = find(target.tensor);
    if (target.offset > t.size || target.out.size() > t.size - target.offset) {
      SINEW_THROW(CheckpointError, "{}: tensor '{}' has {} elements, elements [{}, {}) were asked for", path,
                  t.name, t.size, target.offset, target.offset + target.out.size());
    }
  }
  if (info.schema_version < 2) {  // no data offsets: through HDF5, whole
    const TrainingState st = load(path, options);
    for (const auto& target : targets) {
      const auto& v = st.tensors.at(target.tensor);
      std::copy_n(v.begin() + static_cast<std::ptrdiff_t>(target.offset), target.out.size(),
                  target.out.begin());
    }
    return info;
  }
  const fs::path dir = dir_of(path);
  const auto deadline = deadline_in(options.retry_s);
  const int world = info.meta.world_size;
  std::vector<float> buffer;
  for (int r = 0; r < world; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    const std::string file = (dir / shard_name(r, world)).string();
    Fd fd;
    for (const auto& target : targets) {
      const auto& t = find(target.tensor);
      const std::uint64_t begin = t.shard_offsets[ri], end = t.shard_offsets[ri + 1];
      const std::uint64_t lo = std::max(begin, target.offset),
                          hi = std::min(end, target.offset + target.out.size());
      if (lo >= hi) continue;
      if (fd.fd < 0) {
        require_present(file, deadline, "shard file");
        fd.fd = open_shard(file, info.shard_file_sizes[ri]);
      }
      // The whole slice is read (its CRC32 covers all of it): straight into `out` when it lies inside.
      const bool inside = lo == begin && hi == end;
      float* dest = target.out.data() + (begin - target.offset);
      if (!inside) {
        buffer.resize(static_cast<std::size_t>(end - begin));
        dest = buffer.data();
      }
      const std::uint64_t bytes = (end - begin) * sizeof(float), at = t.shard_data_offsets[ri];
      if (at > info.shard_file_sizes[ri] || bytes > info.shard_file_sizes[ri] - at) {
        SINEW_THROW(CheckpointError, "{}: the manifest places tensor '{}' outside the file", file, t.name);
      }
      auto* p = reinterpret_cast<char*>(dest);
      for (std::uint64_t got = 0; got < bytes;) {
        const ssize_t n =
            ::pread(fd.fd, p + got, static_cast<std::size_t>(bytes - got), static_cast<off_t>(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) SINEW_THROW(CheckpointError, "{}: read failed: {}", file, errno_text(errno));
        if (n == 0) SINEW_THROW(CheckpointError, "{}: ends early: the file is truncated", file);
        got += static_cast<std::uint64_t>(n);
      }
      const std::uint32_t crc = h5::crc32_bytes(dest, static_cast<std::size_t>(bytes));
      if (crc != t.shard_crc32[ri]) {
        SINEW_THROW(
            CheckpointError,
            "{}: tensor '{}' fails its CRC32 check (manifest 0x{:08x}, data 0x{:08x}): the shard is corrupt",
            file, t.name, t.shard_crc32[ri], crc);
      }
      if (!inside)
        std::copy(buffer.begin() + static_cast<std::ptrdiff_t>(lo - begin),
                  buffer.begin() + static_cast<std::ptrdiff_t>(hi - begin),
                  target.out.begin() + static_cast<std::ptrdiff_t>(lo - target.offset));
    }
  }
  return info;
}

std::string verify(const std::string& path, const LoadOptions& options) {
  try {
    load(path, options);
    return {};
  } catch (const CheckpointError& e) {
    return e.message();
  } catch (const std::exception& e) {  // filesystem errors, allocation failures: still "not valid"
    return fmt::format("{}: {}", path, e.what());
  }
}

std::vector<std::string> missing_files(const std::string& path) {
  const fs::path dir = dir_of(path);
  std::vector<std::string> missing;
  std::error_code ec;
  const fs::path manifest = dir / kManifestFile;
  if (!fs::exists(manifest, ec)) return {manifest.string()};
  ManifestInfo info;
  try {
    info = read_manifest(path, LoadOptions{0});
  } catch (const CheckpointError&) {
    return {};  // damaged, not missing
  }
  for (int r = 0; r < info.meta.world_size; ++r) {
    const fs::path file = dir / shard_name(r, info.meta.world_size);
    if (!fs::exists(file, ec)) missing.push_back(file.string());
  }
  return missing;
}

std::string quick_check(const std::string& path) {
  try {
    const ManifestInfo info = read_manifest(path, LoadOptions{0});
    const fs::path dir = dir_of(path);
    for (int r = 0; r < info.meta.world_size; ++r) {
      const fs::path file = dir / shard_name(r, info.meta.world_size);
      std::error_code ec;
      const auto size = fs::file_size(file, ec);
      if (ec) return fmt::format("{}: {}", file.string(), ec.message());
      if (size != info.shard_file_sizes[static_cast<std::size_t>(r)])
        return fmt::format("{}: has {} bytes, its checkpoint records {}", file.string(), size,
                           info.shard_file_sizes[static_cast<std::size_t>(r)]);
    }
    return {};
  } catch (const CheckpointError& e) {
    return e.message();
  }
}

void export_plain(const TrainingState& state, const std::string& file) {
  const auto names = schema::tensor_names(state);
  std::size_t bytes = 0;
  for (const auto& name : names) bytes += state.tensors.at(name).size() * sizeof(float);
  h5::MemoryFile f(file, bytes);
  schema::write_meta(f.get(), state, names, file);
  for (const auto& name : names) {
    const auto& v = state.tensors.at(name);
    h5::write_floats(f.get(), "tensors/" + name, v.data(), v.size(), file);
  }
  h5::write_image(f, file, /*sync=*/true);
}

}  // namespace sinew::checkpoint
