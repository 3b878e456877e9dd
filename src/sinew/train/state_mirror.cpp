#include "sinew/train/state_mirror.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

namespace sinew::train {

namespace {

constexpr std::array<char, 8> kMagic{'S', 'I', 'N', 'E', 'W', 'M', 'R', '1'};
constexpr std::size_t kHeaderBytes = 4096;

/// The file's first page. seq[i]: 0 empty, odd while slot i is written, even (2 x the write's number) once
/// it is complete; step[i]: the training step slot i holds.
struct Header {
  std::array<char, 8> magic;
  std::uint64_t layout;
  std::uint64_t slot_bytes;
  std::uint64_t seq[2];
  std::int64_t step[2];
};
static_assert(sizeof(Header) <= kHeaderBytes);

std::size_t slot_bytes_of(const NamedSpans& tensors) {
  std::size_t n = sizeof(Position);
  for (const auto& t : tensors) n += t.second.size_bytes();
  return n;
}

/// The slot holding the newest complete copy, if any.
std::optional<int> newest_slot(const Header& h) {
  std::optional<int> best;
  for (int i = 0; i < 2; ++i) {
    const std::uint64_t s = h.seq[i];
    if (s == 0 || s % 2 != 0) continue;  // empty, or torn (its writer died in the middle)
    if (!best || s > h.seq[*best]) best = i;
  }
  return best;
}

bool pread_all(int fd, void* buf, std::size_t n, std::size_t off) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<std::size_t>(r);
  }
  return true;
}

/// Reads the header of the file at `path` if it is a mirror of `layout`.
std::optional<Header> read_header(int fd, std::uint64_t layout) {
  Header h{};
  if (!pread_all(fd, &h, sizeof h, 0)) return std::nullopt;
  if (h.magic != kMagic || h.layout != layout) return std::nullopt;
  return h;
}

/// An 8-byte field of the mapped header, accessed atomically: the order of the stores is what a reader in a
/// later process relies on.
std::atomic_ref<std::uint64_t> field(std::uint64_t& v) { return std::atomic_ref<std::uint64_t>(v); }

}  // namespace

StateMirror::StateMirror(std::string dir, std::uint64_t layout) : dir_(std::move(dir)), layout_(layout) {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  path_ = (std::filesystem::path(dir_) / fmt::format("state-{}.bin", host[0] != '\0' ? host.data() : "node"))
              .string();
}

StateMirror::~StateMirror() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

std::uint64_t StateMirror::layout_hash(const NamedSpans& tensors, std::size_t dataset_size,
                                       std::uint64_t seed) {
  // FNV-1a over the names, sizes, data set size and seed.
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& [name, span] : tensors) {
    mix(name.data(), name.size() + 1);
    const std::uint64_t n = span.size();
    mix(&n, sizeof n);
  }
  const std::uint64_t d = dataset_size;
  mix(&d, sizeof d);
  mix(&seed, sizeof seed);
  mix(&kMagic, sizeof kMagic);
  return h;
}

bool StateMirror::map(std::size_t slot_bytes) {
  auto fail = [&](const std::string& why) {
    spdlog::warn(
        "--state-mirror: cannot keep the state in {}: {}; a relaunch will start from the latest checkpoint",
        path_, why);
    failed_ = true;
    return false;
  };
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return fail(ec.message());
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) return fail(std::system_category().message(errno));
  }
  const std::size_t total = kHeaderBytes + 2 * slot_bytes;
  const auto old = read_header(fd_, layout_);
  struct stat st {};
  const bool reuse = old && old->slot_bytes == slot_bytes && ::fstat(fd_, &st) == 0 &&
                     static_cast<std::size_t>(st.st_size) == total;
  if (!reuse) {
    // Another layout, or none yet: start the file afresh, its space reserved now (a write into a mapped
    // tmpfs page that cannot be allocated would be SIGBUS, not an error).
    if (::ftruncate(fd_, 0) != 0) return fail(std::system_category().message(errno));
    if (const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(total)); rc != 0) {
      (void)::ftruncate(fd_, 0);
      return fail(std::system_category().message(rc));
    }
  }
  void* m = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) return fail(std::system_category().message(errno));
  map_ = m;
  map_bytes_ = total;
  slot_bytes_ = slot_bytes;
  if (!reuse) {
    auto* h = static_cast<Header*>(map_);
    h->layout = layout_;
    h->slot_bytes = slot_bytes;
    h->seq[0] = h->seq[1] = 0;
    h->step[0] = h->step[1] = -1;
    std::atomic_thread_fence(std::memory_order_release);
    std::memcpy(h->magic.data(), kMagic.data(), kMagic.size());  // last: a header without it is ignored
  }
  return true;
}

bool StateMirror::write(const Position& p, const NamedSpans& tensors) {
  if (failed_) return false;
  const std::size_t bytes = slot_bytes_of(tensors);
  if (map_ == nullptr || bytes != slot_bytes_) {
    if (map_ != nullptr) {
      ::munmap(map_, map_bytes_);
      map_ = nullptr;
    }
    if (!map(bytes)) return false;
  }
  auto* h = static_cast<Header*>(map_);
  // Into the slot that does not hold the newest complete copy (a torn one is written over first); the
  // write's number is one more than any started before.
  const Header now{h->magic,
                   h->layout,
                   h->slot_bytes,
                   {field(h->seq[0]).load(), field(h->seq[1]).load()},
                   {h->step[0], h->step[1]}};
  const auto keep = newest_slot(now);
  const int slot = keep ? 1 - *keep : 0;
  const std::uint64_t n = std::max((now.seq[0] + 1) / 2, (now.seq[1] + 1) / 2) + 1;
  field(h->seq[slot]).store(2 * n - 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // odd before any byte of the copy
  auto* out = static_cast<char*>(map_) + kHeaderBytes + static_cast<std::size_t>(slot) * slot_bytes_;
  std::memcpy(out, &p, sizeof p);
  out += sizeof p;
  for (const auto& t : tensors) {
    std::memcpy(out, t.second.data(), t.second.size_bytes());
    out += t.second.size_bytes();
  }
  h->step[slot] = p.step;
  field(h->seq[slot]).store(2 * n, std::memory_order_release);  // complete: every byte above before it
  return true;
}

std::optional<std::int64_t> StateMirror::newest() const {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const auto h = read_header(fd, layout_);
  ::close(fd);
  if (!h) return std::nullopt;
  const auto slot = newest_slot(*h);
  if (!slot) return std::nullopt;
  return h->step[*slot];
}

bool StateMirror::read(Position& p, const NamedSpans& tensors) const {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = false;
  if (const auto h = read_header(fd, layout_); h && h->slot_bytes == slot_bytes_of(tensors)) {
    if (const auto slot = newest_slot(*h)) {
      std::size_t off = kHeaderBytes + static_cast<std::size_t>(*slot) * h->slot_bytes;
      Position q{};
      ok = pread_all(fd, &q, sizeof q, off);
      off += sizeof q;
      for (const auto& t : tensors) {
        if (!ok) break;
        ok = pread_all(fd, t.second.data(), t.second.size_bytes(), off);
        off += t.second.size_bytes();
      }
      // Unchanged meanwhile (no process writes it while a relaunch reads, but a reader must not trust that).
      const auto again = read_header(fd, h->layout);
      ok = ok && again && again->seq[*slot] == h->seq[*slot];
      if (ok) p = q;
    }
  }
  ::close(fd);
  return ok;
}

void StateMirror::remove() {
  if (map_ != nullptr) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
  }
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  failed_ = true;  // nothing more is written
}

}  // namespace sinew::train
