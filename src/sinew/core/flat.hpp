// The flat layout: every parameter of a model lives in ONE contiguous float buffer (and its gradient at the
// same offset of a second one), so that collectives, optimisers, checkpoints and the state sync see spans
// and slices only, whatever is being trained. Two types describe a part of such a buffer:
//
//   Slice       a contiguous range of elements (a layer's gradients in ready order, a bucket's piece)
//   TensorView  a named, shaped Slice: one tensor of the model ("fc1/weight", "layer1.0.conv1.weight"),
//               for checkpoints (its HDF5 view), PowerSGD (its matrix) and error messages (its name)
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace sinew {

/// `count` elements from `offset` of a flat buffer.
struct Slice {
  std::size_t offset = 0;
  std::size_t count = 0;

  [[nodiscard]] constexpr std::size_t end() const noexcept { return offset + count; }
  /// The slice's elements of `buffer` (which must hold end() elements).
  template <class T>
  [[nodiscard]] std::span<T> of(std::span<T> buffer) const {
    return buffer.subspan(offset, count);
  }
  friend bool operator==(const Slice&, const Slice&) = default;
};

/// A named, shaped array inside a flat tensor. Its elements are contiguous, in C order (row major) of
/// `shape`; a view cannot transpose, so `shape` is the layout the elements really have, and `layout` says
/// how to use them.
struct TensorView {
  std::string name;                ///< "fc1/weight" (a layer's own views: "weight")
  std::string tensor = "params";   ///< the flat tensor it lies in
  std::size_t offset = 0;          ///< first element within `tensor` (a layer's own views: within the layer)
  std::vector<std::size_t> shape;  ///< C-order shape of the elements as stored; {} is a scalar
  std::string layout;              ///< how to use it, e.g. "y = x @ weight + bias" (may be empty)

  /// Elements: the product of the shape.
  [[nodiscard]] std::size_t count() const noexcept {
    std::size_t n = 1;
    for (const std::size_t d : shape) n *= d;
    return n;
  }
  [[nodiscard]] Slice slice() const noexcept { return {offset, count()}; }
  /// As a matrix: the first dimension is the rows, the others flattened are the columns (a vector is
  /// rows x 1, a scalar 1 x 1).
  [[nodiscard]] std::size_t rows() const noexcept { return shape.empty() ? 1 : shape[0]; }
  [[nodiscard]] std::size_t cols() const noexcept {
    std::size_t n = 1;
    for (std::size_t d = 1; d < shape.size(); ++d) n *= shape[d];
    return n;
  }
};

/// Named buffers of the flat layout (an optimiser's state: "momentum", "adam_m", ...), in a fixed order.
using NamedSpans = std::vector<std::pair<std::string, std::span<float>>>;

}  // namespace sinew
