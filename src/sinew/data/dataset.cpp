// Dataset accessors, whole-file reading (plain or gzip), the portable RNG and the by-name registry.
#include "sinew/data/dataset.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string_view>
#include <system_error>

#include "sinew/core/error.hpp"

namespace sinew::data {

namespace fs = std::filesystem;

// --- Dataset ---------------------------------------------------------------------------------------

std::span<const float> Dataset::sample(std::size_t i) const {
  if (i >= size())
    SINEW_THROW(InvalidArgument, "sample index {} out of range: the data set has {}", i, size());
  const auto d = static_cast<std::size_t>(dim());
  return {features.data() + i * d, d};
}

void Dataset::gather(std::span<const std::size_t> indices, float* out, std::int32_t* labels_out) const {
  const auto d = static_cast<std::size_t>(dim());
  const std::size_t n = size();
  for (std::size_t j = 0; j < indices.size(); ++j) {
    const std::size_t i = indices[j];
    if (i >= n)
      SINEW_THROW(InvalidArgument, "gather: sample index {} out of range: the data set has {}", i, n);
    std::memcpy(out + j * d, features.data() + i * d, d * sizeof(float));
    if (labels_out != nullptr) labels_out[j] = labels[i];
  }
}

void Dataset::truncate(std::size_t n) {
  if (n == 0 || n >= size()) return;
  labels.resize(n);
  features.resize(n * static_cast<std::size_t>(dim()));
  labels.shrink_to_fit();
  features.shrink_to_fit();
}

void Dataset::check_consistent() const {
  SINEW_ENFORCE(channels > 0 && height > 0 && width > 0, "bad sample shape {}x{}x{}", channels, height,
                width);
  SINEW_ENFORCE_EQ(features.size(), size() * static_cast<std::size_t>(dim()), "features vs labels * dim");
  for (std::size_t i = 0; i < labels.size(); ++i)
    SINEW_ENFORCE(labels[i] >= 0 && labels[i] < num_classes, "label {} of sample {} outside [0, {})",
                  labels[i], i, num_classes);
}

// --- reading files -----------------------------------------------------------------------------------

namespace {

// Debian packages that install data sets under /usr/share/datasets, for the "file not found" hint.
std::string missing_file_hint(const fs::path& path) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 1> kPackages{{
      {"/usr/share/datasets/fashion-mnist", "dataset-fashion-mnist"},
  }};
  const std::string dir = path.parent_path().lexically_normal().string();
  for (const auto& [default_dir, package] : kPackages) {
    if (dir == default_dir)
      return fmt::format(
          "; install the package that provides it (apt-get install {}) or point the data "
          "directory elsewhere",
          package);
  }
  return "";
}

std::string read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) SINEW_THROW(DataError, "cannot open data file '{}': {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  std::string bytes(static_cast<std::size_t>(size), '\0');
  if (!in.read(bytes.data(), size)) SINEW_THROW(DataError, "error reading data file '{}'", path);
  return bytes;
}

// The gzip trailer ends with ISIZE, the uncompressed size mod 2^32. It is only a hint (a truncated or
// corrupt file has garbage there), so it is used to reserve memory and only when plausible.
std::size_t gzip_size_hint(const std::string& path, std::uintmax_t compressed_size) {
  if (compressed_size < 18) return 0;  // a gzip header plus trailer is at least 18 bytes
  std::ifstream in(path, std::ios::binary);
  in.seekg(-4, std::ios::end);
  std::array<unsigned char, 4> b{};
  if (!in.read(reinterpret_cast<char*>(b.data()), 4)) return 0;
  const std::uint64_t isize =
      std::uint64_t{b[0]} | std::uint64_t{b[1]} << 8 | std::uint64_t{b[2]} << 16 | std::uint64_t{b[3]} << 24;
  // Deflate cannot compress better than about 1032:1; past 1 GiB a garbage hint would cost too much memory,
  // so large files grow their buffer instead.
  if (isize > 1032 * compressed_size + 1024 || isize > (std::uint64_t{1} << 30)) return 0;
  return static_cast<std::size_t>(isize);
}

std::string read_gzip(const std::string& path, std::uintmax_t compressed_size) {
  struct GzCloser {
    void operator()(gzFile f) const { gzclose_r(f); }
  };
  std::unique_ptr<gzFile_s, GzCloser> gz(gzopen(path.c_str(), "rb"));
  if (!gz) SINEW_THROW(DataError, "cannot open gzip data file '{}': {}", path, std::strerror(errno));
  gzbuffer(gz.get(), 1U << 18);

  // Reads up to `len` bytes; a negative gzread() result is a corrupt stream (bad block, CRC or length).
  const auto read_some = [&](char* dst, std::size_t len, std::size_t done) {
    const int got = gzread(gz.get(), dst, static_cast<unsigned>(std::min<std::size_t>(len, INT_MAX)));
    if (got < 0) {
      int code = Z_OK;
      const char* msg = gzerror(gz.get(), &code);
      SINEW_THROW(DataError, "corrupt gzip data in '{}': {} (after {} decompressed bytes)", path, msg, done);
    }
    return static_cast<std::size_t>(got);
  };

  // One big buffer, sized from the trailer when plausible, so that Fashion-MNIST's 47 MB of training images
  // decompress in a single gzread() without reallocation.
  const std::size_t hint = gzip_size_hint(path, compressed_size);
  std::string bytes(hint > 0 ? hint : std::size_t{1} << 20, '\0');
  std::size_t used = 0;
  for (;;) {
    if (used == bytes.size()) {
      // Full: probe with a small read before growing, so an exact hint costs no reallocation.
      std::array<char, 1 << 16> probe;
      const std::size_t got = read_some(probe.data(), probe.size(), used);
      if (got == 0) break;
      bytes.resize(std::max(2 * bytes.size(), used + got));
      std::memcpy(bytes.data() + used, probe.data(), got);
      used += got;
      continue;
    }
    const std::size_t got = read_some(bytes.data() + used, bytes.size() - used, used);
    if (got == 0) break;
    used += got;
  }
  // At end of input gzerror() tells a complete stream (Z_OK) from one cut short (Z_BUF_ERROR).
  int code = Z_OK;
  const char* msg = gzerror(gz.get(), &code);
  if (code == Z_BUF_ERROR)
    SINEW_THROW(DataError,
                "truncated gzip file '{}': the compressed stream ends early (after {} decompressed bytes)",
                path, used);
  if (code != Z_OK) SINEW_THROW(DataError, "corrupt gzip data in '{}': {}", path, msg);
  const int close_code = gzclose_r(gz.release());
  if (close_code == Z_BUF_ERROR)
    SINEW_THROW(DataError, "truncated gzip file '{}': the compressed stream ends early", path);
  if (close_code != Z_OK)
    SINEW_THROW(DataError, "error closing gzip data file '{}' (zlib code {})", path, close_code);
  bytes.resize(used);
  return bytes;
}

}  // namespace

std::string read_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st))
    SINEW_THROW(DataError, "data file '{}' not found{}", path, missing_file_hint(fs::path(path)));
  if (fs::is_directory(st)) SINEW_THROW(DataError, "data file '{}' is a directory, expected a file", path);
  const std::uintmax_t size = fs::file_size(path, ec);
  if (ec) SINEW_THROW(DataError, "cannot read data file '{}': {}", path, ec.message());

  std::array<unsigned char, 2> magic{};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) SINEW_THROW(DataError, "cannot open data file '{}': {}", path, std::strerror(errno));
    in.read(reinterpret_cast<char*>(magic.data()), 2);
  }
  if (size >= 2 && magic[0] == 0x1f && magic[1] == 0x8b) return read_gzip(path, size);
  return read_plain(path);
}

// --- Rng ---------------------------------------------------------------------------------------------

std::uint64_t Rng::splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::uint64_t Rng::mix(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t s = a;
  const std::uint64_t ha = splitmix64(s);
  s = b ^ ha;
  return splitmix64(s);
}

Rng::Rng(std::uint64_t seed) noexcept {
  std::uint64_t state = seed;
  for (auto& word : s_)
    word = splitmix64(state);  // never all zero: splitmix64 is a bijection of distinct inputs
}

std::uint64_t Rng::next() noexcept {
  const auto rotl = [](std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); };
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t Rng::uniform_below(std::uint64_t bound) noexcept {
  // Rejection: drop the values below 2^64 mod bound so that every residue is equally likely.
  const std::uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const std::uint64_t r = next();
    if (r >= threshold) return r % bound;
  }
}

double Rng::uniform01() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

double Rng::normal() noexcept {
  if (has_spare_) {
    has_spare_ = false;
    return spare_normal_;
  }
  const double u1 = 1.0 - uniform01();  // (0, 1]: log() stays finite
  const double u2 = uniform01();
  const double r = std::sqrt(-2.0 * std::log(u1));
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  spare_normal_ = r * std::sin(kTwoPi * u2);
  has_spare_ = true;
  return r * std::cos(kTwoPi * u2);
}

// --- registry ----------------------------------------------------------------------------------------

namespace {

constexpr std::string_view kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// "<dir>/<stem>.gz", or "<dir>/<stem>" when only the uncompressed file exists.
std::string idx_file(const std::string& dir, const std::string& stem) {
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path plain = fs::path(dir) / stem;
  std::error_code ec;
  if (!fs::exists(gz, ec) && fs::exists(plain, ec)) return plain.string();
  return gz.string();
}

std::string csv_file(const std::string& dir, const std::string& stem) {
  const fs::path plain = fs::path(dir) / (stem + ".csv");
  const fs::path gz = fs::path(dir) / (stem + ".csv.gz");
  std::error_code ec;
  if (!fs::exists(plain, ec) && fs::exists(gz, ec)) return gz.string();
  return plain.string();
}

std::string shape_string(const Dataset& d) { return fmt::format("{}x{}x{}", d.channels, d.height, d.width); }

DataSplit load_idx_split(const std::string& name, const std::string& dir, float mean, float stddev) {
  DataSplit split;
  split.train = load_idx(idx_file(dir, "train-images-idx3-ubyte"), idx_file(dir, "train-labels-idx1-ubyte"),
                         10, mean, stddev);
  split.test = load_idx(idx_file(dir, "t10k-images-idx3-ubyte"), idx_file(dir, "t10k-labels-idx1-ubyte"), 10,
                        mean, stddev);
  if (split.train.dim() != split.test.dim())
    SINEW_THROW(DataError, "{} in '{}': train images are {} but test images are {}", name, dir,
                shape_string(split.train), shape_string(split.test));
  split.description = fmt::format("{} from {}", name, dir);
  return split;
}

DataSplit load_csv_split(const DatasetOptions& opts) {
  if (opts.data_dir.empty())
    SINEW_THROW(InvalidArgument, "data set 'csv' needs a data directory holding train.csv and test.csv");
  DataSplit split;
  const std::string train_path = csv_file(opts.data_dir, "train");
  const std::string test_path = csv_file(opts.data_dir, "test");
  split.train = load_csv(train_path, opts.csv);
  split.test = load_csv(test_path, opts.csv);
  if (split.train.channels != split.test.channels || split.train.height != split.test.height ||
      split.train.width != split.test.width)
    SINEW_THROW(DataError, "'{}' has samples of shape {} but '{}' has {}", train_path,
                shape_string(split.train), test_path, shape_string(split.test));
  // Labels are numbered 0..K-1 across both files; a class may be missing from the (smaller) test file.
  const int classes = std::max(split.train.num_classes, split.test.num_classes);
  split.train.num_classes = split.test.num_classes = classes;
  split.description = fmt::format("csv from {}", opts.data_dir);
  return split;
}

}  // namespace

std::vector<std::string> dataset_names() { return {"fashion-mnist", "mnist", "csv", "synthetic"}; }

DataSplit load_dataset(const DatasetOptions& opts) {
  DataSplit split;
  if (opts.name == "fashion-mnist") {
    const std::string dir = opts.data_dir.empty() ? std::string(kFashionMnistDir) : opts.data_dir;
    split = load_idx_split(opts.name, dir, 0.2860F, 0.3530F);
  } else if (opts.name == "mnist") {
    if (opts.data_dir.empty())
      SINEW_THROW(InvalidArgument,
                  "data set 'mnist' needs a data directory holding "
                  "{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte.gz");
    split = load_idx_split(opts.name, opts.data_dir, 0.1307F, 0.3081F);
  } else if (opts.name == "csv") {
    split = load_csv_split(opts);
  } else if (opts.name == "synthetic") {
    constexpr std::size_t kTrain = 8192, kTest = 2048;
    // One stream for both splits: the same class means, disjoint samples.
    Dataset all = make_synthetic(kTrain + kTest, 1, 8, 8, 10, opts.seed);
    const auto d = static_cast<std::size_t>(all.dim());
    split.train = split.test = Dataset{all.channels, all.height, all.width, all.num_classes, {}, {}};
    split.train.features.assign(all.features.begin(),
                                all.features.begin() + static_cast<std::ptrdiff_t>(kTrain * d));
    split.train.labels.assign(all.labels.begin(), all.labels.begin() + static_cast<std::ptrdiff_t>(kTrain));
    split.test.features.assign(all.features.begin() + static_cast<std::ptrdiff_t>(kTrain * d),
                               all.features.end());
    split.test.labels.assign(all.labels.begin() + static_cast<std::ptrdiff_t>(kTrain), all.labels.end());
    split.description = fmt::format("synthetic (seed {})", opts.seed);
  } else {
    std::string valid;
    for (const auto& n : dataset_names()) valid += (valid.empty() ? "" : ", ") + n;
    SINEW_THROW(InvalidArgument, "unknown data set '{}'; valid names: {}", opts.name, valid);
  }
  split.train.truncate(opts.limit_train);
  split.test.truncate(opts.limit_test);
  split.description += fmt::format(": {} train / {} test samples, {}, {} classes", split.train.size(),
                                   split.test.size(), shape_string(split.train), split.train.num_classes);
  return split;
}

std::string fingerprint(const Dataset& d) {
  // zlib's crc32 takes a uInt length: feed it in pieces.
  uLong crc = crc32(0L, Z_NULL, 0);
  auto add = [&crc](const void* p, std::size_t n) {
    const auto* b = static_cast<const Bytef*>(p);
    while (n > 0) {
      const auto k = static_cast<uInt>(std::min<std::size_t>(n, 1U << 30));
      crc = crc32(crc, b, k);
      b += k;
      n -= k;
    }
  };
  add(d.features.data(), d.features.size() * sizeof(float));
  add(d.labels.data(), d.labels.size() * sizeof(std::int32_t));
  return fmt::format("{}x{}:{}:{:08x}", d.size(), d.dim(), d.num_classes, static_cast<std::uint32_t>(crc));
}

}  // namespace sinew::data
