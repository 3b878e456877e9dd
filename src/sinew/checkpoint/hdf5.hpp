// Thin checked RAII wrappers over the HDF5 C API (HighFive style): one owner per hid_t, moves leave the
// source invalid, destructors never throw. Internal to the checkpoint layer.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
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

/// Size and CRC32 of a whole file's bytes.
struct Digest {
  std::uint64_t size = 0;
  std::uint32_t crc32 = 0;
};
/// CRC32 (the zlib/gzip polynomial, so zlib's crc32() gives the same value) of a byte range, continuing
/// from `crc` (0 to start). Computed with ISA-L's carry-less-multiply code, several times zlib's speed.
std::uint32_t crc32_bytes(const void* data, std::size_t n, std::uint32_t crc = 0);
/// The CRC32 of two ranges one after the other, from the CRC32 of each and the second one's length.
std::uint32_t crc32_combine(std::uint32_t first, std::uint32_t second, std::uint64_t second_size);

/// Bytes in one malloc'd block: a file image HDF5 built.
struct Image {
  std::unique_ptr<char, void (*)(void*)> data{nullptr, std::free};
  std::size_t size = 0;      ///< bytes of the file
  std::size_t capacity = 0;  ///< bytes of the block
};

/// An HDF5 file built in memory (core driver, no backing store): nothing touches the disk until the caller
/// writes take()'s bytes. Sinew writes checkpoints this way so that an I/O error such as a full disk is met
/// by its own POSIX code, cleanly, instead of inside HDF5 (whose half-flushed files crashed at process
/// exit), and so that each file reaches the filesystem as one large sequential write. HDF5 builds the file
/// in a buffer Sinew allocates and keeps: data written with H5Dwrite is copied once, into that buffer, and
/// take() hands it over without a copy. `path` only names the file in messages; `size_hint` (bytes) is the
/// size the file is expected to reach, to allocate once; `recycled`, an earlier image whose block is used
/// again if it is large enough (its pages are already mapped: no page faults).
class MemoryFile {
 public:
  explicit MemoryFile(const std::string& path, std::size_t size_hint = 0, Image recycled = {});
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  ~MemoryFile();
  [[nodiscard]] hid_t get() const noexcept { return file_.get(); }
  /// Flushes and closes the file; returns its bytes. Throws CheckpointError naming the file.
  Image take();
  /// write_floats() into this file without keeping the copy: the data is written in pieces of 4 MiB, and
  /// the image's whole pages of each piece are given back once written (they read as zero in take()'s
  /// bytes). The caller writes the data's bytes at the returned offset itself, from `data` (the writer:
  /// straight from the state), so the image holds little more than the file's metadata.
  std::uint64_t pass_floats(const std::string& name, const float* data, std::size_t n);

  struct Sink;  ///< where HDF5's memory callbacks keep the file's block (hdf5.cpp)

 private:
  std::unique_ptr<Sink> sink_;
  Handle file_;
  std::string path_;
};

/// Writes `n` bytes to `path` (created or truncated) and, with `sync`, fsyncs it. Throws CheckpointError
/// naming `path` on any error (ENOSPC: "disk full").
void write_file(const std::string& path, const void* data, std::size_t n, bool sync);
/// The same with the file's bytes in pieces, written one after the other.
void write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces, bool sync);
/// MemoryFile::take(), then write_file(); returns the digest of the bytes written.
Digest write_image(MemoryFile& f, const std::string& path, bool sync);

/// An HDF5 file opened read-only over bytes in memory, without a copy: `bytes` must outlive `file`
/// (members are destroyed in reverse order, so `file` closes first).
struct OpenImage {
  std::vector<char> bytes;
  Handle file;
  [[nodiscard]] hid_t get() const noexcept { return file.get(); }
};
/// Reads `path` whole (at most `expected.size` bytes), checks it against `expected`, and opens it
/// read-only over the same buffer. HDF5 1.10 is not robust against corrupt files (fuzzing found a heap
/// overflow inside H5Aexists within seconds), so Sinew never lets it parse bytes that fail their CRC32.
/// Throws CheckpointError naming `path` for a missing, short, long or corrupt file.
OpenImage open_verified(const std::string& path, const Digest& expected);
/// fsync of a file or directory; throws CheckpointError naming it.
void fsync_path(const std::string& path, bool directory);
Handle open_file(const std::string& path);
Handle create_group(hid_t loc, const std::string& name);

/// A 1-D float dataset with the given contents, stored contiguously; returns the byte offset of its data in
/// the file (0 for an empty one).
std::uint64_t write_floats(hid_t loc, const std::string& name, const float* data, std::size_t n,
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
