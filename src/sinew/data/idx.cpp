// IDX files (the MNIST format): a big-endian header -- magic 0x000008TT with TT the element type (08 = u8)
// and, in its low byte, the number of dimensions, then one u32 per dimension -- followed by the elements.
#include <array>
#include <cstdint>

#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"

namespace sinew::data {

namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;  // u8, 3 dimensions: count x rows x cols
constexpr std::uint32_t kLabelsMagic = 0x00000801;  // u8, 1 dimension: count

std::uint32_t read_be32(const std::string& bytes, std::size_t offset) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + offset;
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 |
         std::uint32_t{p[3]};
}

const char* describe_magic(std::uint32_t magic) {
  switch (magic) {
    case kImagesMagic:
      return " (an IDX image file)";
    case kLabelsMagic:
      return " (an IDX label file)";
    default:
      return "";
  }
}

// Parses the header of an IDX u8 file with `rank` dimensions and checks that the payload size is exactly
// what the header promises. Returns the dimensions and leaves the payload at offset 4 + 4 * rank.
template <std::size_t Rank>
std::array<std::uint32_t, Rank> parse_header(const std::string& bytes, const std::string& path,
                                             std::uint32_t expected_magic, const char* kind) {
  const std::size_t header = 4 + 4 * Rank;
  if (bytes.size() < 4)
    SINEW_THROW(DataError, "IDX {} file '{}' is truncated: {} bytes, too short for a header", kind, path,
                bytes.size());
  const std::uint32_t magic = read_be32(bytes, 0);
  if (magic != expected_magic)
    SINEW_THROW(DataError, "IDX {} file '{}' has bad magic number 0x{:08x}{}, expected 0x{:08x}", kind, path,
                magic, describe_magic(magic), expected_magic);
  if (bytes.size() < header)
    SINEW_THROW(DataError, "IDX {} file '{}' is truncated: {} bytes, the header alone needs {}", kind, path,
                bytes.size(), header);
  std::array<std::uint32_t, Rank> dims{};
  std::uint64_t elements = 1;
  for (std::size_t i = 0; i < Rank; ++i) {
    dims[i] = read_be32(bytes, 4 + 4 * i);
    // Saturate instead of overflowing: three u32 dimensions can exceed 2^64 in a garbage header.
    elements = (dims[i] != 0 && elements > UINT64_MAX / 2 / dims[i]) ? UINT64_MAX / 2 : elements * dims[i];
  }
  const std::uint64_t expected = header + elements;
  if (bytes.size() < expected)
    SINEW_THROW(DataError, "IDX {} file '{}' is truncated: the header promises {} bytes, the file has {}",
                kind, path, expected, bytes.size());
  if (bytes.size() > expected)
    SINEW_THROW(DataError, "IDX {} file '{}' has {} bytes after the {} its header promises", kind, path,
                bytes.size() - expected, expected);
  return dims;
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path, int num_classes, float mean,
                 float stddev) {
  if (num_classes < 1 || num_classes > 256)
    SINEW_THROW(InvalidArgument, "load_idx: num_classes must be in [1, 256] for u8 labels, got {}",
                num_classes);
  if (!(stddev > 0.F))
    SINEW_THROW(InvalidArgument, "load_idx: normalisation stddev must be > 0, got {}", stddev);

  const std::string images = read_file(images_path);
  const auto [count, rows, cols] = parse_header<3>(images, images_path, kImagesMagic, "image");
  if (rows == 0 || cols == 0)
    SINEW_THROW(DataError, "IDX image file '{}' has empty images ({}x{})", images_path, rows, cols);
  if (rows > (1U << 15) || cols > (1U << 15) || std::uint64_t{rows} * cols > (1U << 30))
    SINEW_THROW(DataError, "IDX image file '{}' has implausible image size {}x{}", images_path, rows, cols);

  const std::string label_bytes = read_file(labels_path);
  const auto [label_count] = parse_header<1>(label_bytes, labels_path, kLabelsMagic, "label");
  if (label_count != count)
    SINEW_THROW(DataError,
                "IDX files disagree on the number of samples: '{}' has {} images, '{}' has {} labels",
                images_path, count, labels_path, label_count);

  Dataset d;
  d.channels = 1;
  d.height = static_cast<int>(rows);
  d.width = static_cast<int>(cols);
  d.num_classes = num_classes;

  const auto* label_data = reinterpret_cast<const unsigned char*>(label_bytes.data()) + 8;
  d.labels.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (label_data[i] >= num_classes)
      SINEW_THROW(DataError, "IDX label file '{}': label {} of sample {} is out of range [0, {})",
                  labels_path, label_data[i], i, num_classes);
    d.labels[i] = label_data[i];
  }

  // (p / 255 - mean) / stddev through a 256-entry table: one load per pixel.
  std::array<float, 256> table{};
  for (int p = 0; p < 256; ++p)
    table[static_cast<std::size_t>(p)] = (static_cast<float>(p) / 255.F - mean) / stddev;
  const auto* pixels = reinterpret_cast<const unsigned char*>(images.data()) + 16;
  const std::size_t total = std::size_t{count} * rows * cols;
  d.features.resize(total);
  for (std::size_t i = 0; i < total; ++i) d.features[i] = table[pixels[i]];
  return d;
}

}  // namespace sinew::data
