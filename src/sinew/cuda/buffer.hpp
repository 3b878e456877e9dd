// RAII for device memory and page-locked host memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "sinew/core/error.hpp"
#include "sinew/cuda/check.hpp"

namespace sinew::cuda {

/// `size` elements of T in device memory (cudaMalloc, on the device current at construction; no
/// allocation for size 0). The contents start uninitialised. Move-only.
///
/// Copies are asynchronous on the given stream. From or to ordinary (pageable) host memory, CUDA stages
/// them: upload() returns once the source has been read, download() once the data has arrived, so host
/// vectors may be used at once. From or to pinned memory (PinnedBuffer) the copy really is asynchronous,
/// and the host memory must stay untouched until the stream has passed the copy.
template <class T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "device buffers hold plain bytes");

 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t size) : size_(size) {
    if (size_ > 0) {
      void* p = nullptr;
      SINEW_CUDA(cudaMalloc(&p, size_ * sizeof(T)));
      data_ = static_cast<T*>(p);
    }
  }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  /// Device pointer (nullptr when empty); never dereference it on the host.
  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }

  /// Copies `src` to elements [offset, offset + src.size()). Throws InvalidArgument if that does not fit.
  void upload(std::span<const T> src, cudaStream_t stream, std::size_t offset = 0) {
    check_range(src.size(), offset, "upload");
    if (src.empty()) return;
    SINEW_CUDA(cudaMemcpyAsync(data_ + offset, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream));
  }
  /// Copies elements [offset, offset + dst.size()) to `dst`. Throws InvalidArgument if that does not fit.
  void download(std::span<T> dst, cudaStream_t stream, std::size_t offset = 0) const {
    check_range(dst.size(), offset, "download");
    if (dst.empty()) return;
    SINEW_CUDA(cudaMemcpyAsync(dst.data(), data_ + offset, dst.size_bytes(), cudaMemcpyDeviceToHost, stream));
  }
  /// Sets every byte to 0 (for float and integer T: every element to 0).
  void zero(cudaStream_t stream) {
    if (size_ > 0) SINEW_CUDA(cudaMemsetAsync(data_, 0, size_ * sizeof(T), stream));
  }

 private:
  void check_range(std::size_t count, std::size_t offset, const char* what) const {
    if (offset > size_ || count > size_ - offset) {
      SINEW_THROW(InvalidArgument, "DeviceBuffer::{}: elements [{}, {}) of a buffer of {}", what, offset,
                  offset + count, size_);
    }
  }
  void release() noexcept {
    // cudaFree waits for the device to finish work that may still use the memory.
    if (data_ != nullptr) (void)cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// `size` elements of T in page-locked host memory (cudaMallocHost), which the GPU copies from and to
/// asynchronously: the landing place of results read back without a staged, blocking copy. Move-only.
template <class T>
class PinnedBuffer {
  static_assert(std::is_trivially_copyable_v<T>, "pinned buffers hold plain bytes");

 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t size) : size_(size) {
    if (size_ > 0) {
      void* p = nullptr;
      SINEW_CUDA(cudaMallocHost(&p, size_ * sizeof(T)));
      data_ = static_cast<T*>(p);
    }
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      if (data_ != nullptr) (void)cudaFreeHost(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::span<T> span() noexcept { return {data_, size_}; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace sinew::cuda
