// Data sets held in memory: IDX (MNIST / Fashion-MNIST), CSV and a synthetic Gaussian-blob problem, plus
// the portable random number generator that data shuffling and synthetic data are built on.
//
// Every loader validates its input completely and throws DataError (exit code 3) naming the file and the
// problem; bad options throw InvalidArgument (exit code 2). Nothing here depends on MPI: every rank loads
// the full data set and the DistributedSampler (sampler.hpp) decides which samples a rank sees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace sinew::data {

/// A labelled classification data set, fully in memory.
struct Dataset {
  int channels = 1, height = 1, width = 1;  ///< sample shape; dim() = channels * height * width
  int num_classes = 0;
  /// size() * dim() values; sample i lies at [i * dim, (i + 1) * dim), channel-major (c * H * W + y * W + x).
  std::vector<float> features;
  std::vector<std::int32_t> labels;  ///< size() values, each in [0, num_classes)

  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
  [[nodiscard]] int dim() const noexcept { return channels * height * width; }

  /// The features of sample i; throws InvalidArgument when i >= size().
  [[nodiscard]] std::span<const float> sample(std::size_t i) const;

  /// Copies the samples `indices` into `out`, a dim() x indices.size() column-major matrix (one column per
  /// sample, in the order of `indices`), and their labels into `labels_out` (skipped when null). `out` must
  /// hold dim() * indices.size() floats. Throws InvalidArgument on an index >= size().
  void gather(std::span<const std::size_t> indices, float* out, std::int32_t* labels_out) const;

  /// Keeps only the first n samples (no-op when n == 0 or n >= size()).
  void truncate(std::size_t n);

  /// Checks the invariants above (sizes agree, labels in range); throws InternalError when broken.
  void check_consistent() const;
};

struct DataSplit {
  Dataset train, test;
  std::string description;  ///< one line for logs: source, sizes, shape, classes
};

/// Reads an IDX image file (magic 0x00000803, u8 pixels, N x rows x cols) and an IDX label file (magic
/// 0x00000801, u8 labels), each gzip-compressed or plain (told apart by the gzip magic 1f 8b). Pixels are
/// scaled to [0, 1], then normalised to (x - mean) / stddev, where mean and stddev are those of the
/// training set (Fashion-MNIST 0.2860 / 0.3530, MNIST 0.1307 / 0.3081).
/// Throws DataError naming the file on: a missing file (with the package that provides it when the path is
/// a Debian default), a bad magic number, a file shorter or longer than its header promises, a corrupt or
/// truncated gzip stream, different sample counts in the two files, a label >= num_classes.
/// Throws InvalidArgument when num_classes < 1 or stddev <= 0.
Dataset load_idx(const std::string& images_path, const std::string& labels_path, int num_classes, float mean,
                 float stddev);

/// CSV layout. The shape is either given in full (channels, height, width all > 0, product = number of
/// feature columns) or left at 0 for 1 x 1 x D.
struct CsvOptions {
  bool label_first = false;  ///< label in the first column instead of the last
  int channels = 0, height = 0, width = 0;
  float scale = 1.f;  ///< features are multiplied by this (e.g. 1/255 for raw pixels)
};

/// Reads a CSV file (gzip or plain): one sample per line, comma-separated, an integer label >= 0 in the
/// last (or first) column and finite numeric features in the others. A first line with a non-numeric field
/// is taken for a header and skipped; blank lines are skipped; "\r\n" line ends are accepted.
/// num_classes = largest label + 1. Throws DataError with file:line on ragged rows, empty or non-numeric
/// fields, a negative or fractional label, a shape that does not match, or a file without samples.
Dataset load_csv(const std::string& path, const CsvOptions& opts = {});

/// A deterministic, learnable Gaussian-blob problem: class k has a mean vector drawn from N(0, 1) per
/// feature, a sample of class k is that mean plus N(0, 2^2) noise per feature, labels are uniform.
/// The result depends only on the arguments (portable RNG, no std:: distributions) and is prefix-stable:
/// make_synthetic(n, ...) is the first n samples of make_synthetic(m, ...) for any m >= n.
Dataset make_synthetic(std::size_t n, int channels, int height, int width, int num_classes,
                       std::uint64_t seed);

/// Which data set load_dataset() reads.
///   "fashion-mnist"  IDX files {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz in data_dir
///                    (default /usr/share/datasets/fashion-mnist, Debian package dataset-fashion-mnist)
///   "mnist"          the same file names; data_dir required
///   "csv"            data_dir holds train.csv and test.csv (or train.csv.gz / test.csv.gz); see `csv`
///   "synthetic"      make_synthetic(): 8192 train + 2048 test samples, 1x8x8, 10 classes, `seed`
/// For the IDX sets a file name without ".gz" is accepted when the ".gz" one is absent.
struct DatasetOptions {
  std::string name = "fashion-mnist";
  std::string data_dir;
  std::uint64_t seed = 1;                       ///< synthetic data only
  std::size_t limit_train = 0, limit_test = 0;  ///< > 0: keep only the first N samples of that split
  CsvOptions csv;                               ///< "csv" only
};

/// Loads a data set by name; throws InvalidArgument (listing the valid names) for an unknown name.
DataSplit load_dataset(const DatasetOptions& opts);

/// The names load_dataset() accepts.
std::vector<std::string> dataset_names();

/// Identifies a data set's contents: "<samples>x<dim>:<classes>:<crc32 of features and labels, hex>".
/// A teacher and its students compare it before logits are exchanged by sample index.
std::string fingerprint(const Dataset& d);

/// Reads a whole file into memory, decompressing it when it starts with the gzip magic 1f 8b.
/// Throws DataError naming the file when it is missing (with a package hint for Debian default paths),
/// unreadable, or a corrupt or truncated gzip stream.
std::string read_file(const std::string& path);

/// Portable pseudo-random numbers: xoshiro256** seeded through splitmix64. The sequence depends only on
/// the seed (same on every platform and standard library), which is what makes shuffles reproducible
/// across ranks and synthetic data reproducible across machines.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) noexcept;

  /// One splitmix64 step: advances `state` and returns a well-mixed 64-bit value.
  static std::uint64_t splitmix64(std::uint64_t& state) noexcept;
  /// Mixes two values into one seed (e.g. a base seed and an epoch number).
  static std::uint64_t mix(std::uint64_t a, std::uint64_t b) noexcept;

  std::uint64_t next() noexcept;
  /// Uniform in [0, bound), without modulo bias; bound must be > 0.
  std::uint64_t uniform_below(std::uint64_t bound) noexcept;
  /// Uniform in [0, 1) with 53 random bits.
  double uniform01() noexcept;
  /// Standard normal (Box-Muller; uses std::log/sqrt/cos, which agree to the last bit or so across libms).
  double normal() noexcept;

 private:
  std::uint64_t s_[4];
  double spare_normal_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace sinew::data
