#include "sinew/checkpoint/hdf5.hpp"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "sinew/core/error.hpp"
#include "sinew/core/pages.hpp"

namespace sinew::checkpoint::h5 {

namespace {
[[noreturn]] void fail(const std::string& file, const std::string& what) {
  SINEW_THROW(CheckpointError, "{}: {}", file, what);
}

/// strerror() is not thread-safe and shard files are written on a background thread.
std::string errno_text(int err) { return std::generic_category().message(err); }

template <class T>
hid_t native() {
  if constexpr (std::is_same_v<T, std::int64_t>)
    return H5T_NATIVE_INT64;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return H5T_NATIVE_UINT64;
  else
    return H5T_NATIVE_UINT32;
}

template <class T>
void write_array_attr(hid_t obj, const std::string& name, const T* v, std::size_t n, const std::string& file,
                      bool scalar = false) {
  const hsize_t dims = n;
  Handle space(scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &dims, nullptr), H5Sclose);
  Handle attr(H5Acreate2(obj, name.c_str(), native<T>(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (attr.get() < 0 || H5Awrite(attr.get(), native<T>(), v) < 0)
    fail(file, "cannot write attribute " + name);
}

Handle open_attr(hid_t obj, const std::string& name, const std::string& file) {
  if (H5Aexists(obj, name.c_str()) <= 0) fail(file, "attribute '" + name + "' is missing");
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose);
  if (attr.get() < 0) fail(file, "cannot open attribute " + name);
  return attr;
}

template <class T>
std::vector<T> read_array_attr(hid_t obj, const std::string& name, const std::string& file) {
  Handle attr = open_attr(obj, name, file);
  Handle space(H5Aget_space(attr.get()), H5Sclose);
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || n > (1 << 24)) fail(file, "attribute " + name + " has an implausible size");
  std::vector<T> v(static_cast<std::size_t>(n));
  if (n > 0 && H5Aread(attr.get(), native<T>(), v.data()) < 0) fail(file, "cannot read attribute " + name);
  return v;
}

template <class T>
T read_scalar_attr(hid_t obj, const std::string& name, const std::string& file) {
  auto v = read_array_attr<T>(obj, name, file);
  if (v.size() != 1) fail(file, "attribute " + name + " is not a scalar");
  return v[0];
}
}  // namespace

Handle intermediate_groups() {
  Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  return lcpl;
}

void quiet() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

// --- file images -------------------------------------------------------------------------------------------
// HDF5's core driver allocates, resizes and frees a file's memory through these callbacks when they are set
// (H5Pset_file_image_callbacks). A MemoryFile's callbacks keep the block at close instead of freeing it; a
// read-only image's callbacks hand HDF5 the caller's buffer instead of a copy (what H5LT's
// H5LT_FILE_IMAGE_DONT_COPY does).

struct MemoryFile::Sink {
  void* kept = nullptr;      // the file's memory, once HDF5 closed the file
  std::size_t capacity = 0;  // bytes allocated for it
  std::size_t reserve = 0;   // first allocation at least this large
  Image spare;               // a block to use for the first allocation, if large enough
};

namespace {

void* sink_malloc(std::size_t size, H5FD_file_image_op_t /*op*/, void* /*udata*/) {
  return std::malloc(size);
}

void* sink_memcpy(void* dest, const void* src, std::size_t size, H5FD_file_image_op_t /*op*/,
                  void* /*udata*/) {
  return std::memcpy(dest, src, size);
}

void* sink_realloc(void* ptr, std::size_t size, H5FD_file_image_op_t /*op*/, void* udata) {
  auto* sink = static_cast<MemoryFile::Sink*>(udata);
  if (ptr != nullptr && size <= sink->capacity) return ptr;  // a shrink, or room left: nothing to move
  // The first block is made large enough for the whole file, so the data is never moved.
  const std::size_t want = ptr == nullptr ? std::max(size, sink->reserve) : size;
  if (ptr == nullptr && sink->spare.data && sink->spare.capacity >= want) {
    sink->capacity = sink->spare.capacity;
    return sink->spare.data.release();
  }
  void* p = std::realloc(ptr, want);
  if (p != nullptr) sink->capacity = want;
  return p;
}

herr_t sink_free(void* ptr, H5FD_file_image_op_t op, void* udata) {
  auto* sink = static_cast<MemoryFile::Sink*>(udata);
  if (op == H5FD_FILE_IMAGE_OP_FILE_CLOSE && ptr != nullptr) {
    std::free(sink->kept);
    sink->kept = ptr;  // the file's bytes: take() hands them over
  } else {
    std::free(ptr);
  }
  return 0;
}

void* same_udata(void* udata) { return udata; }
herr_t keep_udata(void* /*udata*/) { return 0; }

// Read-only image over the caller's buffer: every "allocation" is the buffer itself.
struct Borrowed {
  void* data;
};
void* borrow_malloc(std::size_t /*size*/, H5FD_file_image_op_t /*op*/, void* udata) {
  return static_cast<Borrowed*>(udata)->data;
}
void* borrow_memcpy(void* dest, const void* src, std::size_t size, H5FD_file_image_op_t /*op*/,
                    void* /*udata*/) {
  if (dest != src) std::memcpy(dest, src, size);
  return dest;
}
void* borrow_realloc(void* /*ptr*/, std::size_t /*size*/, H5FD_file_image_op_t /*op*/, void* /*udata*/) {
  return nullptr;  // a read-only file never grows
}
herr_t borrow_free(void* /*ptr*/, H5FD_file_image_op_t /*op*/, void* /*udata*/) { return 0; }

}  // namespace

MemoryFile::MemoryFile(const std::string& path, std::size_t size_hint, Image recycled)
    : sink_(std::make_unique<Sink>()), path_(path) {
  sink_->spare = std::move(recycled);
  quiet();
  // Metadata of a checkpoint file is a few KiB per tensor; the reserve spares one reallocation.
  sink_->reserve = size_hint + (64u << 10);
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(fapl.get(), 1u << 20, /*backing_store=*/0);
  // No sieve buffer: every write of data reaches the image at once (pass_floats() gives its pages back right
  // after; in memory a second buffer saves nothing).
  H5Pset_sieve_buf_size(fapl.get(), 0);
  H5FD_file_image_callbacks_t cb{sink_malloc, sink_memcpy, sink_realloc, sink_free,
                                 same_udata,  keep_udata,  sink_.get()};
  if (H5Pset_file_image_callbacks(fapl.get(), &cb) < 0) fail(path, "cannot set up the in-memory HDF5 file");
  // Default (earliest) file format on purpose: with the 1.8/1.10 formats, HDF5 1.10.8 hands out file
  // images whose superblock checksum no longer matches (the image's EOF field is patched afterwards), and
  // they cannot be opened. Tensor data is protected by Sinew's own CRC32s (see docs).
  file_ = Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (file_.get() < 0) fail(path, "cannot create the in-memory HDF5 file");
}

MemoryFile::~MemoryFile() {
  file_.reset();
  std::free(sink_->kept);
}

std::uint64_t MemoryFile::pass_floats(const std::string& name, const float* data, std::size_t n) {
  const hsize_t dims = n;
  Handle space(H5Screate_simple(1, &dims, nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every element is written right away
  Handle ds(H5Dcreate2(file_.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), intermediate_groups().get(),
                       dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (ds.get() < 0) fail(path_, "cannot create dataset " + name);
  // In order, so that each piece lies at the end of the file: HDF5's in-memory driver zeroes the stretch
  // between the file's end and a write beyond it first, which would take a whole dataset's memory at once.
  constexpr hsize_t kPiece = hsize_t{1} << 20;  // elements (4 MiB)
  haddr_t offset = HADDR_UNDEF;
  for (hsize_t at = 0; at < n; at += kPiece) {
    const hsize_t count = std::min<hsize_t>(kPiece, n - at);
    Handle mem(H5Screate_simple(1, &count, nullptr), H5Sclose);
    Handle sel(H5Scopy(space.get()), H5Sclose);
    H5Sselect_hyperslab(sel.get(), H5S_SELECT_SET, &at, nullptr, &count, nullptr);
    if (H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, mem.get(), sel.get(), H5P_DEFAULT, data + at) < 0)
      fail(path_, "cannot write dataset " + name);
    offset = H5Dget_offset(ds.get());
    if (offset == HADDR_UNDEF) fail(path_, "dataset " + name + " has no contiguous storage");
    // The driver's block of the file (its handle is the address of the block's pointer).
    void* handle = nullptr;
    std::byte* block = nullptr;
    if (H5Fget_vfd_handle(file_.get(), H5P_DEFAULT, &handle) >= 0 && handle != nullptr)
      block = *static_cast<std::byte**>(handle);
    if (block == nullptr) fail(path_, "cannot reach the in-memory HDF5 file's bytes");
    release_pages(std::span<std::byte>(block + offset + at * sizeof(float), count * sizeof(float)));
  }
  if (!ds.close()) fail(path_, "cannot close dataset " + name);
  return n > 0 ? static_cast<std::uint64_t>(offset) : 0;
}

Image MemoryFile::take() {
  if (file_.get() < 0) fail(path_, "the in-memory HDF5 file was already taken");
  // The file's logical size: what H5Fget_file_image would copy out.
  const ssize_t n = H5Fget_file_image(file_.get(), nullptr, 0);
  if (n < 0) fail(path_, "cannot size the in-memory HDF5 file");
  if (!file_.close()) fail(path_, "cannot close the in-memory HDF5 file");
  if (sink_->kept == nullptr || static_cast<std::size_t>(n) > sink_->capacity)
    fail(path_, "the in-memory HDF5 file lost its bytes at close");
  Image img;
  img.data.reset(static_cast<char*>(std::exchange(sink_->kept, nullptr)));
  img.size = static_cast<std::size_t>(n);
  img.capacity = sink_->capacity;
  return img;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) fail(path, std::string("cannot open to fsync: ") + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(path, std::string("fsync failed: ") + errno_text(err));
}

std::uint32_t crc32_bytes(const void* data, std::size_t n, std::uint32_t crc) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  while (n > 0) {  // ISA-L takes a 64-bit length; chunks keep every call bounded anyway
    const std::size_t chunk = std::min<std::size_t>(n, std::size_t{1} << 30);
    crc = crc32_gzip_refl(crc, bytes, chunk);
    bytes += chunk;
    n -= chunk;
  }
  return crc;
}

std::uint32_t crc32_combine(std::uint32_t first, std::uint32_t second, std::uint64_t second_size) {
  return static_cast<std::uint32_t>(::crc32_combine64(first, second, static_cast<z_off64_t>(second_size)));
}

OpenImage open_verified(const std::string& path, const Digest& expected) {
  quiet();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text(errno));
  // Check the size before allocating for it: `expected` may come from a damaged record.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != expected.size) {
    const auto actual = static_cast<long long>(st.st_size);
    ::close(fd);
    fail(path, fmt::format("has {} bytes, its checkpoint records {}: the file is truncated or damaged",
                           actual, expected.size));
  }
  OpenImage out;
  // One byte more than expected, to notice a file that grew while being read.
  std::vector<char>& bytes = out.bytes;
  bytes.resize(static_cast<std::size_t>(expected.size) + 1);
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      fail(path, "read failed: " + errno_text(err));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  if (got > expected.size)
    fail(path, fmt::format("is longer than the {} bytes its checkpoint records", expected.size));
  if (got < expected.size) {
    fail(path,
         fmt::format("has {} bytes, its checkpoint records {}: the file is truncated", got, expected.size));
  }
  bytes.resize(got);
  const std::uint32_t crc = crc32_bytes(bytes.data(), got);
  if (crc != expected.crc32) {
    fail(path, fmt::format("fails its CRC32 check (expected 0x{:08x}, file 0x{:08x}): the file is corrupt",
                           expected.crc32, crc));
  }
  if (got == 0) fail(path, "is empty: not an HDF5 file");
  // HDF5 works on `bytes` itself: the callbacks lend it the buffer for every copy it would make.
  Borrowed lend{bytes.data()};
  H5FD_file_image_callbacks_t cb{borrow_malloc, borrow_memcpy, borrow_realloc, borrow_free,
                                 same_udata,    keep_udata,    &lend};
  Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_core(fapl.get(), 1u << 20, /*backing_store=*/0);
  if (H5Pset_file_image_callbacks(fapl.get(), &cb) < 0 ||
      H5Pset_file_image(fapl.get(), bytes.data(), got) < 0)
    fail(path, "cannot hand the file image to HDF5");
  // A name that is not on disk: the core driver refuses an image under the name of an existing file.
  const std::string name = path + ".verified-image";
  out.file = Handle(H5Fopen(name.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (out.file.get() < 0) fail(path, "cannot open as HDF5");
  return out;
}

void write_file(const std::string& path, const void* data, std::size_t n, bool sync) {
  const std::span<const std::byte> one(static_cast<const std::byte*>(data), n);
  write_file(path, std::span<const std::span<const std::byte>>(&one, 1), sync);
}

void write_file(const std::string& path, std::span<const std::span<const std::byte>> pieces, bool sync) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, std::string("cannot create: ") + errno_text(errno));
  std::size_t n = 0, done = 0;
  for (const auto& p : pieces) n += p.size();
  for (const auto& p : pieces) {
    for (std::size_t in = 0; in < p.size();) {
      const ssize_t w = ::write(fd, p.data() + in, p.size() - in);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : ENOSPC;
        ::close(fd);
        fail(path, fmt::format("write failed after {} of {} bytes: {}{}", done, n, errno_text(err),
                               err == ENOSPC ? " (disk full)" : ""));
      }
      in += static_cast<std::size_t>(w);
      done += static_cast<std::size_t>(w);
    }
  }
  if (sync && ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::string("fsync failed: ") + errno_text(err));
  }
  if (::close(fd) != 0) fail(path, std::string("close failed: ") + errno_text(errno));
}

Digest write_image(MemoryFile& f, const std::string& path, bool sync) {
  const Image img = f.take();
  write_file(path, img.data.get(), img.size, sync);
  return {img.size, crc32_bytes(img.data.get(), img.size)};
}

Handle open_file(const std::string& path) {
  quiet();
  Handle f(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (f.get() < 0) fail(path, "cannot open as HDF5 (missing, truncated or corrupt)");
  return f;
}

Handle create_group(hid_t loc, const std::string& name) {
  Handle g(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
  if (g.get() < 0) SINEW_THROW(CheckpointError, "cannot create HDF5 group {}", name);
  return g;
}

std::uint64_t write_floats(hid_t loc, const std::string& name, const float* data, std::size_t n,
                           const std::string& file) {
  const hsize_t dims = n;
  Handle space(H5Screate_simple(1, &dims, nullptr), H5Sclose);
  Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);  // every element is written right away
  Handle ds(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), intermediate_groups().get(),
                       dcpl.get(), H5P_DEFAULT),
            H5Dclose);
  if (ds.get() < 0) fail(file, "cannot create dataset " + name);
  if (n > 0 && H5Dwrite(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    fail(file, "cannot write dataset " + name + " (disk full?)");
  }
  const haddr_t offset = n > 0 ? H5Dget_offset(ds.get()) : HADDR_UNDEF;
  if (n > 0 && offset == HADDR_UNDEF) fail(file, "dataset " + name + " has no contiguous storage");
  if (!ds.close()) fail(file, "cannot close dataset " + name + " (disk full?)");
  return n > 0 ? static_cast<std::uint64_t>(offset) : 0;
}

std::uint64_t dataset_size(hid_t loc, const std::string& name, const std::string& file) {
  if (H5Lexists(loc, name.c_str(), H5P_DEFAULT) <= 0) fail(file, "dataset '" + name + "' is missing");
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (ds.get() < 0) fail(file, "cannot open dataset " + name);
  Handle space(H5Dget_space(ds.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1) fail(file, "dataset " + name + " is not one-dimensional");
  hsize_t dims = 0;
  H5Sget_simple_extent_dims(space.get(), &dims, nullptr);
  return dims;
}

void read_floats(hid_t loc, const std::string& name, float* out, std::size_t n, const std::string& file) {
  if (dataset_size(loc, name, file) != n) fail(file, "dataset " + name + " has an unexpected size");
  Handle ds(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (n > 0 && H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) {
    fail(file, "cannot read dataset " + name + " (truncated or corrupt file)");
  }
}

void write_attr(hid_t obj, const std::string& name, std::int64_t v, const std::string& file) {
  write_array_attr(obj, name, &v, 1, file, /*scalar=*/true);
}
void write_attr(hid_t obj, const std::string& name, std::uint64_t v, const std::string& file) {
  write_array_attr(obj, name, &v, 1, file, /*scalar=*/true);
}
void write_attr(hid_t obj, const std::string& name, const std::vector<std::uint64_t>& v,
                const std::string& file) {
  write_array_attr(obj, name, v.data(), v.size(), file);
}
void write_attr(hid_t obj, const std::string& name, const std::vector<std::uint32_t>& v,
                const std::string& file) {
  write_array_attr(obj, name, v.data(), v.size(), file);
}
void write_attr(hid_t obj, const std::string& name, const std::string& v, const std::string& file) {
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<std::size_t>(v.size(), 1));
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);  // the whole size is text, no terminator
  Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  Handle attr(H5Acreate2(obj, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const std::string padded = v.empty() ? std::string(1, '\0') : v;
  if (attr.get() < 0 || H5Awrite(attr.get(), type.get(), padded.data()) < 0) {
    fail(file, "cannot write attribute " + name);
  }
}

std::int64_t read_attr_i64(hid_t obj, const std::string& name, const std::string& file) {
  return read_scalar_attr<std::int64_t>(obj, name, file);
}
std::uint64_t read_attr_u64(hid_t obj, const std::string& name, const std::string& file) {
  return read_scalar_attr<std::uint64_t>(obj, name, file);
}
std::vector<std::uint64_t> read_attr_u64s(hid_t obj, const std::string& name, const std::string& file) {
  return read_array_attr<std::uint64_t>(obj, name, file);
}
std::vector<std::uint32_t> read_attr_u32s(hid_t obj, const std::string& name, const std::string& file) {
  return read_array_attr<std::uint32_t>(obj, name, file);
}

std::string read_attr_string(hid_t obj, const std::string& name, const std::string& file) {
  Handle attr = open_attr(obj, name, file);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0) {
    fail(file, "attribute " + name + " is not a fixed-length string");
  }
  const std::size_t n = H5Tget_size(type.get());
  if (n > (64u << 20)) fail(file, "attribute " + name + " has an implausible size");
  std::string s(n, '\0');
  if (H5Aread(attr.get(), type.get(), s.data()) < 0) fail(file, "cannot read attribute " + name);
  if (auto z = s.find('\0'); z != std::string::npos) s.resize(z);
  return s;
}

std::vector<std::string> members(hid_t group, const std::string& file) {
  H5G_info_t info{};
  if (H5Gget_info(group, &info) < 0) fail(file, "cannot list group");
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len =
        H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    if (len < 0) fail(file, "cannot read a group member's name");
    std::string name(static_cast<std::size_t>(len) + 1, '\0');
    H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT);
    name.resize(static_cast<std::size_t>(len));
    names.push_back(std::move(name));
  }
  return names;
}

}  // namespace sinew::checkpoint::h5
