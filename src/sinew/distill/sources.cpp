#include "sinew/distill/sources.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/distill/teacher_model.hpp"

namespace sinew::distill {

namespace h5 = checkpoint::h5;

namespace {

class LocalTeacher final : public LogitSource {
 public:
  LocalTeacher(const std::string& path, const data::Dataset& train)
      : model_(TeacherModel::load(path, train)), train_(train) {}
  void fetch(std::span<const std::size_t> indices, Clock::time_point /*deadline*/,
             std::vector<float>& out) override {
    const std::lock_guard lock(mu_);  // one model, one forward pass at a time
    model_.logits(train_, indices, out);
  }
  [[nodiscard]] int classes() const override { return model_.classes(); }
  [[nodiscard]] bool synchronous() const override { return true; }
  [[nodiscard]] std::string describe() const override {
    return fmt::format("teacher {} (step {}) in this process, from {}", model_.spec(), model_.step(),
                       model_.path());
  }

 private:
  std::mutex mu_;
  TeacherModel model_;
  const data::Dataset& train_;
};

class Table final : public LogitSource {
 public:
  Table(std::string path, std::vector<float> logits, int classes, std::string model)
      : path_(std::move(path)), logits_(std::move(logits)), classes_(classes), model_(std::move(model)) {}
  void fetch(std::span<const std::size_t> indices, Clock::time_point /*deadline*/,
             std::vector<float>& out) override {
    const auto c = static_cast<std::size_t>(classes_);
    out.resize(indices.size() * c);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      if ((indices[k] + 1) * c > logits_.size()) {
        SINEW_THROW(ServiceError, "logit table {}: sample {} is outside it", path_, indices[k]);
      }
      std::memcpy(out.data() + k * c, logits_.data() + indices[k] * c, c * sizeof(float));
    }
  }
  [[nodiscard]] int classes() const override { return classes_; }
  [[nodiscard]] bool synchronous() const override { return true; }
  [[nodiscard]] std::string describe() const override {
    return fmt::format("logit table {} (teacher {})", path_, model_);
  }

 private:
  std::string path_;
  std::vector<float> logits_;
  int classes_;
  std::string model_;
};

}  // namespace

std::unique_ptr<LogitSource> local_teacher(const std::string& path, const data::Dataset& train) {
  return std::make_unique<LocalTeacher>(path, train);
}

std::uint64_t write_logit_table(const std::string& checkpoint, const data::Dataset& train,
                                const std::string& out) {
  TeacherModel teacher = TeacherModel::load(checkpoint, train);
  const auto c = static_cast<std::size_t>(teacher.classes());
  std::vector<float> table(train.size() * c);
  std::vector<std::size_t> idx;
  std::vector<float> part;
  constexpr std::size_t kChunk = 4096;
  for (std::size_t s = 0; s < train.size(); s += kChunk) {
    const std::size_t m = std::min(kChunk, train.size() - s);
    idx.resize(m);
    for (std::size_t i = 0; i < m; ++i) idx[i] = s + i;
    teacher.logits(train, idx, part);
    std::memcpy(table.data() + s * c, part.data(), m * c * sizeof(float));
  }
  h5::quiet();
  const std::string tmp = out + ".tmp";
  {
    h5::MemoryFile f(tmp, table.size() * sizeof(float) + (1U << 16));
    h5::write_floats(f.get(), "logits", table.data(), table.size(), out);
    h5::write_attr(f.get(), "classes", static_cast<std::uint64_t>(c), out);
    h5::write_attr(f.get(), "samples", static_cast<std::uint64_t>(train.size()), out);
    h5::write_attr(f.get(), "dataset", data::fingerprint(train), out);
    h5::write_attr(f.get(), "model", teacher.spec(), out);
    h5::write_attr(f.get(), "step", teacher.step(), out);
    h5::write_attr(f.get(), "checkpoint", teacher.path(), out);
    h5::write_image(f, tmp, /*sync=*/true);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, out, ec);
  if (ec) SINEW_THROW(DataError, "cannot rename {} to {}: {}", tmp, out, ec.message());
  return train.size();
}

std::unique_ptr<LogitSource> logit_table(const std::string& path, const data::Dataset& train) {
  if (!std::filesystem::is_regular_file(path)) {
    SINEW_THROW(DataError, "logit table {} does not exist: write it with `sinew-teacher precompute`", path);
  }
  h5::quiet();
  try {
    const h5::Handle f = h5::open_file(path);
    const auto classes = h5::read_attr_u64(f.get(), "classes", path);
    const auto samples = h5::read_attr_u64(f.get(), "samples", path);
    const std::string fp = h5::read_attr_string(f.get(), "dataset", path);
    if (fp != data::fingerprint(train)) {
      SINEW_THROW(DataError,
                  "logit table {} was computed for other data ({}) than this run's ({}): compute it again "
                  "with `sinew-teacher precompute` on this data set",
                  path, fp, data::fingerprint(train));
    }
    const auto n = h5::dataset_size(f.get(), "logits", path);
    if (classes == 0 || n != classes * samples || samples != train.size()) {
      SINEW_THROW(DataError, "logit table {}: {} values for {} samples x {} classes", path, n, samples,
                  classes);
    }
    std::vector<float> logits(n);
    h5::read_floats(f.get(), "logits", logits.data(), n, path);
    return std::make_unique<Table>(path, std::move(logits), static_cast<int>(classes),
                                   h5::read_attr_string(f.get(), "model", path));
  } catch (const CheckpointError& e) {  // the h5 layer speaks of checkpoints: a table is data here
    SINEW_THROW(DataError, "logit table {} is unreadable: {}", path, e.message());
  }
}

}  // namespace sinew::distill
