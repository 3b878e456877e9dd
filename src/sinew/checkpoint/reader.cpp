#include "sinew/checkpoint/reader.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/checkpoint/schema.hpp"
#include "sinew/core/error.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {

namespace {

/// Reads and strictly parses the manifest's sidecar, DIR/manifest.h5.crc32.
h5::Digest read_sidecar(const fs::path& dir) {
  const std::string side = (dir / kManifestChecksumFile).string();
  std::ifstream in(side);
  if (!in) SINEW_THROW(CheckpointError, "{}: missing (not a committed checkpoint)", side);
  std::string text(64, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(in.gcount()));
  static const std::regex kLine(R"(([0-9a-f]{8}) ([0-9]{1,15})\n?)");
  std::smatch m;
  if (!std::regex_match(text, m, kLine)) {
    SINEW_THROW(CheckpointError, "{}: corrupt (expected '<crc32> <size>')", side);
  }
  return {std::stoull(m[2].str()), static_cast<std::uint32_t>(std::stoul(m[1].str(), nullptr, 16))};
}

/// The checkpoint directory of `path`: itself, or the directory of a manifest.h5 path.
fs::path dir_of(const std::string& path) {
  fs::path dir = path;
  if (!fs::is_directory(dir)) dir = dir.parent_path();
  return dir;
}

}  // namespace

ManifestInfo read_manifest(const std::string& path) {
  if (!fs::exists(path)) SINEW_THROW(CheckpointError, "{}: no such checkpoint", path);
  const fs::path dir = dir_of(path);
  const std::string file = (dir / kManifestFile).string();
  if (!fs::exists(file))
    SINEW_THROW(CheckpointError, "{}: manifest is missing (not a committed checkpoint)", file);
  h5::Handle f = h5::open_verified(file, read_sidecar(dir));
  ManifestInfo info;
  info.schema_version = static_cast<int>(h5::read_attr_i64(f.get(), "schema_version", file));
  if (info.schema_version != kSchemaVersion) {
    SINEW_THROW(CheckpointError, "{}: schema version {} is not supported (this Sinew reads version {})", file,
                info.schema_version, kSchemaVersion);
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
  if (info.shard_file_sizes.size() != static_cast<std::size_t>(info.meta.world_size) ||
      info.shard_file_crc32.size() != static_cast<std::size_t>(info.meta.world_size)) {
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
    const auto w = static_cast<std::size_t>(info.meta.world_size);
    if (t.shard_offsets.size() != w + 1 || t.shard_crc32.size() != w || t.shard_offsets.front() != 0 ||
        t.shard_offsets.back() != t.size || !std::is_sorted(t.shard_offsets.begin(), t.shard_offsets.end())) {
      SINEW_THROW(CheckpointError, "{}: tensor '{}' has inconsistent shard offsets or checksums", file, name);
    }
    info.tensors.push_back(std::move(t));
  }
  return info;
}

TrainingState load(const std::string& path) {
  const ManifestInfo info = read_manifest(path);
  const fs::path dir = dir_of(path);
  TrainingState st = info.meta;
  for (const auto& t : info.tensors) st.tensors[t.name].assign(t.size, 0.f);
  const int world = info.meta.world_size;
  for (int r = 0; r < world; ++r) {
    const std::string file = (dir / shard_name(r, world)).string();
    if (!fs::exists(file)) SINEW_THROW(CheckpointError, "{}: shard file is missing", file);
    const auto ri = static_cast<std::size_t>(r);
    h5::Handle f = h5::open_verified(file, {info.shard_file_sizes[ri], info.shard_file_crc32[ri]});
    if (h5::read_attr_i64(f.get(), "rank", file) != r ||
        h5::read_attr_i64(f.get(), "step", file) != info.meta.step ||
        h5::read_attr_i64(f.get(), "world_size", file) != world) {
      SINEW_THROW(CheckpointError,
                  "{}: shard belongs to another checkpoint (rank, step or world size differ)", file);
    }
    for (const auto& t : info.tensors) {
      const std::size_t begin = t.shard_offsets[ri], count = t.shard_offsets[ri + 1] - begin;
      float* out = st.tensors[t.name].data() + begin;
      h5::read_floats(f.get(), "tensors/" + t.name, out, count, file);
      const std::uint32_t crc = schema::crc32_of(out, count);
      if (crc != t.shard_crc32[ri]) {
        SINEW_THROW(
            CheckpointError,
            "{}: tensor '{}' fails its CRC32 check (manifest 0x{:08x}, data 0x{:08x}): the shard is corrupt",
            file, t.name, t.shard_crc32[ri], crc);
      }
    }
  }
  return st;
}

std::string verify(const std::string& path) {
  try {
    load(path);
    return {};
  } catch (const CheckpointError& e) {
    return e.message();
  } catch (const std::exception& e) {  // filesystem errors, allocation failures: still "not valid"
    return fmt::format("{}: {}", path, e.what());
  }
}

void export_plain(const TrainingState& state, const std::string& file) {
  const auto names = schema::tensor_names(state);
  h5::Handle f = h5::create_memory_file(file);
  schema::write_meta(f.get(), state, names, file);
  for (const auto& name : names) {
    const auto& v = state.tensors.at(name);
    h5::write_floats(f.get(), "tensors/" + name, v.data(), v.size(), file);
  }
  h5::write_image(f.get(), file, /*sync=*/true);
}

}  // namespace sinew::checkpoint
