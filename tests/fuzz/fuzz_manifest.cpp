// libFuzzer target: the checkpoint manifest reader on arbitrary bytes. The input up to its first
// newline becomes the manifest's record, the rest the manifest itself: the commit record (COMMITTED)
// when the line starts with "manifest.h5 ", else an earlier version's sidecar (manifest.h5.crc32);
// read_manifest() must either return a consistent ManifestInfo or throw CheckpointError, never crash,
// hang or touch memory it should not (ASan, UBSan). HDF5 1.10.8 itself overflows a heap buffer on some
// corrupt files within seconds of fuzzing, which is why the reader checks the whole file's CRC32 before
// HDF5 parses it; this target checks that guard and the sidecar parser.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "sinew/checkpoint/reader.hpp"
#include "sinew/core/error.hpp"

namespace {
const std::string& manifest_dir() {
  static const std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sinew-fuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    const std::string d = tmpl + "/ckpt-0000000001";
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}
void write(const std::string& file, const std::uint8_t* data, std::size_t size) {
  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* nl = static_cast<const std::uint8_t*>(std::memchr(data, '\n', size));
  const std::size_t side = nl == nullptr ? size : static_cast<std::size_t>(nl - data) + 1;
  static constexpr char kCommit[] = "manifest.h5 ";
  const bool commit = side >= sizeof(kCommit) - 1 && std::memcmp(data, kCommit, sizeof(kCommit) - 1) == 0;
  std::filesystem::remove(manifest_dir() + (commit ? "/manifest.h5.crc32" : "/COMMITTED"));
  write(manifest_dir() + (commit ? "/COMMITTED" : "/manifest.h5.crc32"), data, side);
  write(manifest_dir() + "/manifest.h5", data + side, size - side);
  try {
    // No waiting for files that are not there yet: on a local disk they never come.
    const auto info = sinew::checkpoint::read_manifest(manifest_dir(), sinew::checkpoint::LoadOptions{0});
    // What the reader accepted must be consistent.
    for (const auto& t : info.tensors) {
      if (t.shard_offsets.size() != static_cast<std::size_t>(info.meta.world_size) + 1) std::abort();
      if (t.shard_offsets.back() != t.size) std::abort();
    }
  } catch (const sinew::CheckpointError&) {
  }
  return 0;
}
