#include "sinew/core/pages.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <system_error>
#include <utility>

#include "sinew/core/error.hpp"

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4  // NOLINT(cppcoreguidelines-macro-usage): Linux 5.7's, older C libraries lack it
#endif

namespace sinew {

namespace {
std::size_t page_size() {
  static const auto p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

std::size_t page_bytes() { return page_size(); }

float* map_pages(std::size_t n) {
  const std::size_t bytes = std::max<std::size_t>(n * sizeof(float), 1);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    SINEW_THROW(Error, "cannot reserve {} MiB of address space for a flat buffer: {}", bytes >> 20,
                std::error_code(errno, std::generic_category()).message());
  }
  return static_cast<float*>(p);
}

void free_pages(float* p, std::size_t n) noexcept {
  if (p != nullptr) munmap(p, std::max<std::size_t>(n * sizeof(float), 1));
}

PlacedFloats::PlacedFloats(std::size_t n, std::size_t page_offset) : n_(n) {
  SINEW_ENFORCE(page_offset % sizeof(float) == 0 && page_offset < page_size(),
                "a buffer placed {} bytes into a page of {}", page_offset, page_size());
  mapped_ = n + page_offset / sizeof(float);
  map_ = map_pages(mapped_);
  data_ = map_ + page_offset / sizeof(float);
}

void PlacedFloats::swap(PlacedFloats& o) noexcept {
  std::swap(map_, o.map_);
  std::swap(mapped_, o.mapped_);
  std::swap(data_, o.data_);
  std::swap(n_, o.n_);
}

namespace {
/// The whole pages inside `buf`, as byte addresses [first, last) (empty: first >= last).
template <typename T>
std::pair<std::uintptr_t, std::uintptr_t> whole_pages(std::span<T> buf) {
  const std::size_t page = page_size();
  const auto lo = reinterpret_cast<std::uintptr_t>(buf.data());
  const auto hi = lo + buf.size_bytes();
  return {(lo + page - 1) / page * page, hi / page * page};
}
}  // namespace

void zero_pages(std::span<float> buf) {
  if (buf.empty()) return;
  const auto [first, last] = whole_pages(buf);
  if (last <= first) {
    std::fill(buf.begin(), buf.end(), 0.f);
    return;
  }
  const auto lo = reinterpret_cast<std::uintptr_t>(buf.data());
  const std::size_t head = (first - lo) / sizeof(float), tail = (last - lo) / sizeof(float);
  std::fill(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(head), 0.f);
  std::fill(buf.begin() + static_cast<std::ptrdiff_t>(tail), buf.end(), 0.f);
  release_pages(buf);
}

std::size_t move_floats(std::span<float> from, std::span<float> to) {
  SINEW_ENFORCE(from.size() == to.size(), "a move of {} floats into {}", from.size(), to.size());
  const auto src = reinterpret_cast<std::uintptr_t>(from.data());
  const auto dst = reinterpret_cast<std::uintptr_t>(to.data());
  const auto copy = [&](std::uintptr_t lo, std::uintptr_t hi) {  // the bytes [lo, hi) of `to`
    const auto a = static_cast<std::ptrdiff_t>((lo - dst) / sizeof(float));
    const auto b = static_cast<std::ptrdiff_t>((hi - dst) / sizeof(float));
    std::copy(from.begin() + a, from.begin() + b, to.begin() + a);
  };
  // (Linux 5.7: MREMAP_DONTUNMAP leaves the source mapped and empty, so the mapping or heap it lies in stays
  // whole.) A move must not span two mappings of the source: EFAULT, and the caller copies.
  const auto move = [&](std::uintptr_t lo, std::uintptr_t hi) {
    void* at = reinterpret_cast<void*>(lo - dst + src);  // NOLINT(performance-no-int-to-ptr)
    void* want = reinterpret_cast<void*>(lo);            // NOLINT(performance-no-int-to-ptr)
    return mremap(at, hi - lo, hi - lo, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, want) == want;
  };
  const auto [first, last] = whole_pages(to);
  const std::uintptr_t end = dst + to.size_bytes();
  if (last <= first || (src - dst) % page_size() != 0) {
    copy(dst, end);
    return 0;
  }
  copy(dst, first);
  copy(last, end);
  if (move(first, last)) return last - first;
  // The source is several mappings (pages an earlier move brought into its buffer): 2 MiB at a time.
  constexpr std::uintptr_t kPiece = std::uintptr_t{2} << 20;
  std::size_t moved = 0;
  for (std::uintptr_t lo = first, hi = 0; lo < last; lo = hi) {
    hi = std::min(lo + kPiece, last);
    if (move(lo, hi)) {
      moved += hi - lo;
    } else {
      copy(lo, hi);
    }
  }
  return moved;
}

void release_pages(std::span<float> buf) { release_pages(std::as_writable_bytes(buf)); }

void release_pages(std::span<std::byte> buf) {
  if (buf.empty()) return;
  const auto [first, last] = whole_pages(buf);
  if (last <= first) return;
  // MADV_DONTNEED on a private anonymous mapping: the pages are dropped now and read as zero.
  std::byte* const at = buf.data() + (first - reinterpret_cast<std::uintptr_t>(buf.data()));
  if (madvise(at, last - first, MADV_DONTNEED) != 0) {
    SINEW_THROW(InternalError, "madvise(MADV_DONTNEED) of {} bytes failed: {}", last - first,
                std::error_code(errno, std::generic_category()).message());
  }
}

void trim_heap() noexcept { malloc_trim(0); }

// (Called once, when the runtime shards the parameters, before training starts.)
void return_large_blocks() noexcept { mallopt(M_MMAP_THRESHOLD, 1 << 20); }  // NOLINT(concurrency-mt-unsafe)

std::size_t resident_bytes() {
  std::ifstream f("/proc/self/statm");
  std::size_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * page_size();
}

}  // namespace sinew
