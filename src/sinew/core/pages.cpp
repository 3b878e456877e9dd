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

namespace sinew {

namespace {
std::size_t page_size() {
  static const auto p = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return p;
}
}  // namespace

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
