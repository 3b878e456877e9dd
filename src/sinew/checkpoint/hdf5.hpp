// Thin checked RAII wrappers over the HDF5 C API (HighFive style): one owner per hid_t, moves leave the
// source invalid, destructors never throw. Internal to the checkpoint layer.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace sinew::checkpoint::h5 {

/// Owns one HDF5 identifier and closes it with the matching H5?close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) : id_(id), close_(closer) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), close_(o.close_) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      close_ = o.close_;
    }
    return *this;
  }
  ~Handle() { reset(); }
  [[nodiscard]] hid_t get() const noexcept { return id_; }
  /// Closes now; returns false if HDF5 reported an error (e.g. the final flush of a file failed).
  bool close() noexcept {
    if (id_ < 0) return true;
    const bool ok = close_(id_) >= 0;
    id_ = H5I_INVALID_HID;
    return ok;
  }
  void reset() noexcept { close(); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

/// A link-creation property list that creates missing intermediate groups ("tensors/optim/momentum").
Handle intermediate_groups();

/// Turns off HDF5's automatic error printing (errors become CheckpointError messages instead).
void quiet();

/// An HDF5 file built in memory (core driver, no backing store): nothing touches the disk until
/// write_image(). Sinew writes checkpoints this way so that an I/O error such as a full disk is met by its
/// own POSIX code, cleanly, instead of inside HDF5 (whose half-flushed files crashed at process exit),
/// and so that each file reaches the filesystem as one large sequential write.
/// `path` only names the file in messages.
Handle create_memory_file(const std::string& path);
/// Writes the in-memory file `f` to `path` (created or truncated) and, with `sync`, fsyncs it. Throws
/// CheckpointError naming `path` on any error (ENOSPC: "disk full").
/// Size and CRC32 of a whole file's bytes.
struct Digest {
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};
/// CRC32 (zlib) of a byte range.
std::uint32_t crc32_bytes(const void* data, std::size_t n);
/// Returns the digest of the bytes written.
Digest write_image(hid_t f, const std::string& path, bool sync);
/// Reads `path` whole (at most `max_size` bytes), checks it against `expected`, and opens it read-only
/// from memory. HDF5 1.10 is not robust against corrupt files (fuzzing found a heap overflow inside
/// H5Aexists within seconds), so Sinew never lets it parse bytes that fail their CRC32. Throws
/// CheckpointError naming `path` for a missing, short, long or corrupt file.
Handle open_verified(const std::string& path, const Digest& expected);
/// fsync of a file or directory; throws CheckpointError naming it.
void fsync_path(const std::string& path, bool directory);
Handle open_file(const std::string& path);
Handle create_group(hid_t loc, const std::string& name);

/// A 1-D float dataset with the given contents.
void write_floats(hid_t loc, const std::string& name, const float* data, std::size_t n,
                  const std::string& file);
/// Size of a 1-D dataset; throws CheckpointError naming `file` if it is missing or not 1-D.
std::uint64_t dataset_size(hid_t loc, const std::string& name, const std::string& file);
void read_floats(hid_t loc, const std::string& name, float* out, std::size_t n, const std::string& file);

void write_attr(hid_t obj, const std::string& name, std::int64_t v, const std::string& file);
void write_attr(hid_t obj, const std::string& name, std::uint64_t v, const std::string& file);
void write_attr(hid_t obj, const std::string& name, const std::string& v, const std::string& file);
void write_attr(hid_t obj, const std::string& name, const std::vector<std::uint64_t>& v,
                const std::string& file);
void write_attr(hid_t obj, const std::string& name, const std::vector<std::uint32_t>& v,
                const std::string& file);

std::int64_t read_attr_i64(hid_t obj, const std::string& name, const std::string& file);
std::uint64_t read_attr_u64(hid_t obj, const std::string& name, const std::string& file);
std::string read_attr_string(hid_t obj, const std::string& name, const std::string& file);
std::vector<std::uint64_t> read_attr_u64s(hid_t obj, const std::string& name, const std::string& file);
std::vector<std::uint32_t> read_attr_u32s(hid_t obj, const std::string& name, const std::string& file);

/// Names of the members of a group, in creation or name order.
std::vector<std::string> members(hid_t group, const std::string& file);

}  // namespace sinew::checkpoint::h5
