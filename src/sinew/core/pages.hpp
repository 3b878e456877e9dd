// Memory whose pages a buffer gives back while it keeps its addresses: the flat buffers of sharded
// parameters (--shard parameters, train/shards.hpp). A member holds a few ranges of a buffer as large as
// the whole model; the rest is released to the system and costs nothing until it is written again (a
// unit's parameters gathered for its forward, a layer's gradients written by backward). The addresses, so
// every tensor that is a view of the buffer, stay valid throughout.
#pragma once

#include <cstddef>
#include <span>

namespace sinew {

/// `n` floats of zero, in private anonymous memory of their own: no page is taken until it is written.
/// Free with free_pages(). Throws Error (naming the size) when the address space is refused.
[[nodiscard]] float* map_pages(std::size_t n);
void free_pages(float* p, std::size_t n) noexcept;

/// map_pages() memory of `n` floats, freed with its owner.
class MappedFloats {
 public:
  explicit MappedFloats(std::size_t n) : n_(n), p_(map_pages(n)) {}
  ~MappedFloats() { free_pages(p_, n_); }
  MappedFloats(const MappedFloats&) = delete;
  MappedFloats& operator=(const MappedFloats&) = delete;
  MappedFloats(MappedFloats&&) = delete;
  MappedFloats& operator=(MappedFloats&&) = delete;
  [[nodiscard]] std::span<float> span() const noexcept { return {p_, n_}; }

 private:
  std::size_t n_;
  float* p_;
};

/// `n` floats of zero in map_pages() memory of their own, element 0 `page_offset` bytes into a page (a
/// multiple of sizeof(float), below the page size): an optimiser's state buffer, which a reshard fills by
/// moving the pages it keeps into it (move_floats; optim::StatePlacement). Moves with its memory.
class PlacedFloats {
 public:
  PlacedFloats() = default;
  PlacedFloats(std::size_t n, std::size_t page_offset);
  ~PlacedFloats() { free_pages(map_, mapped_); }
  PlacedFloats(const PlacedFloats&) = delete;
  PlacedFloats& operator=(const PlacedFloats&) = delete;
  PlacedFloats(PlacedFloats&& o) noexcept { swap(o); }
  PlacedFloats& operator=(PlacedFloats&& o) noexcept {
    PlacedFloats gone(std::move(o));
    swap(gone);
    return *this;
  }
  [[nodiscard]] std::span<float> span() const noexcept { return {data_, n_}; }

 private:
  void swap(PlacedFloats& o) noexcept;
  float* map_ = nullptr;
  std::size_t mapped_ = 0;  // floats
  float* data_ = nullptr;
  std::size_t n_ = 0;
};

/// Gives the whole pages inside `buf` back to the system (madvise MADV_DONTNEED): they read as zero
/// afterwards. The partial pages at either end keep their memory and values (a neighbour's elements may
/// lie there). `buf` must lie in map_pages() memory (or any private anonymous mapping).
void release_pages(std::span<float> buf);
/// The same over bytes (any private anonymous memory: a malloc'd block of the C heap too).
void release_pages(std::span<std::byte> buf);

/// Copies `from` into `to` (the same size, not overlapping), moving what it can instead: where the two lie at
/// the same offset within a page, the whole pages of `to` take `from`'s pages themselves (mremap with
/// MREMAP_DONTUNMAP), which costs neither a copy nor memory taken fresh; `from`'s moved pages read as zero
/// afterwards. Both must lie in private anonymous memory (map_pages(), the C heap). Returns the bytes moved
/// (0: everything copied, as when the offsets differ or the kernel refuses the move).
std::size_t move_floats(std::span<float> from, std::span<float> to);
/// The system's page size in bytes.
[[nodiscard]] std::size_t page_bytes();

/// Zeroes `buf`: its whole pages by release_pages(), the partial ones at either end by writing zeros.
void zero_pages(std::span<float> buf);

/// Returns the memory the C heap holds free to the system (glibc's malloc_trim): tensors freed below the
/// heap's mmap threshold (32 MiB at most) otherwise keep their pages, as the model's own tensors do once
/// they have been moved into the flat buffers.
void trim_heap() noexcept;

/// Makes the C heap give large blocks back when they are freed (a fixed mmap threshold of 1 MiB): glibc
/// otherwise raises the threshold as blocks are freed, up to 32 MiB, and keeps the freed memory of a layer's
/// gradient temporaries in the heap, where it adds up step by step (+180 MB in four steps of a 25 M-parameter
/// model). For sharded parameters, whose point is the memory.
void return_large_blocks() noexcept;

/// Bytes of memory this process has in use now (its resident set), from /proc/self/statm.
[[nodiscard]] std::size_t resident_bytes();

}  // namespace sinew
