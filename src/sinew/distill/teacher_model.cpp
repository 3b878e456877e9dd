#include "sinew/distill/teacher_model.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/core/error.hpp"

namespace fs = std::filesystem;

namespace sinew::distill {

namespace {

/// The run's configuration that the checkpoint records (sinew-train's to_json(Config)).
nlohmann::json config_of(const checkpoint::ManifestInfo& m, const std::string& path) {
  if (m.meta.config_json.empty()) {
    SINEW_THROW(
        CheckpointError,
        "checkpoint {} records no run configuration, so its model cannot be rebuilt; use a checkpoint "
        "written by sinew-train",
        path);
  }
  auto j = nlohmann::json::parse(m.meta.config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    SINEW_THROW(CheckpointError,
                "checkpoint {}: its run configuration is not a JSON object; use another checkpoint", path);
  }
  return j;
}

template <class T>
T field(const nlohmann::json& config, const char* key, const T& fallback, const std::string& path) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception& e) {
    SINEW_THROW(CheckpointError,
                "checkpoint {}: configuration entry \"{}\" has the wrong type ({}); use another "
                "checkpoint",
                path, key, e.what());
  }
}

}  // namespace

std::string TeacherModel::resolve(const std::string& path) {
  if (path.empty())
    SINEW_THROW(InvalidArgument, "no teacher checkpoint given; name a checkpoint or checkpoint root");
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  std::error_code ec;
  if (!fs::is_directory(p, ec)) {
    SINEW_THROW(
        CheckpointError,
        "teacher checkpoint {}: {}; give a checkpoint directory (ckpt-NNNNNNNNNN) or a checkpoint root "
        "(the --checkpoint-dir of a training run)",
        path, fs::exists(p, ec) ? "not a directory" : "no such directory");
  }
  // A checkpoint itself (named like one, or holding a manifest), or else a root that holds checkpoints.
  const bool is_checkpoint = checkpoint::parse_name(fs::path(p).filename().string()).has_value() ||
                             fs::exists(fs::path(p) / checkpoint::kManifestFile, ec);
  if (is_checkpoint) {
    if (!checkpoint::is_committed(p)) {
      SINEW_THROW(CheckpointError,
                  "teacher checkpoint {} is not committed (written in part, or still being written); use a "
                  "committed checkpoint or the checkpoint root",
                  path);
    }
    return p;
  }
  checkpoint::FindOptions fo;
  fo.quick = true;  // load() verifies the bytes it reads
  const auto latest = checkpoint::find_latest(p, fo);
  if (!latest.found) {
    SINEW_THROW(CheckpointError, "teacher checkpoint root {} holds no usable committed checkpoint{}", path,
                latest.skipped.empty() ? std::string()
                                       : fmt::format(" ({} skipped; the newest: {})", latest.skipped.size(),
                                                     latest.skipped.front().reason));
  }
  return latest.found->path;
}

data::DatasetOptions TeacherModel::dataset_options(const std::string& path) {
  const std::string dir = resolve(path);
  const auto config = config_of(checkpoint::read_manifest(dir), dir);
  data::DatasetOptions o;
  o.name = field<std::string>(config, "dataset", o.name, dir);
  o.data_dir = field<std::string>(config, "data_dir", o.data_dir, dir);
  o.seed = field<std::uint64_t>(config, "seed", o.seed, dir);
  o.limit_train = field<std::size_t>(config, "limit_train", o.limit_train, dir);
  o.limit_test = field<std::size_t>(config, "limit_test", o.limit_test, dir);
  return o;
}

TeacherModel TeacherModel::load(const std::string& path, const data::Dataset& data) {
  const std::string dir = resolve(path);
  const auto manifest = checkpoint::read_manifest(dir);
  const auto config = config_of(manifest, dir);
  const auto spec = field<std::string>(config, "model", "", dir);
  if (spec.empty()) {
    SINEW_THROW(CheckpointError,
                "checkpoint {}: its configuration names no model (\"model\"); use a checkpoint "
                "written by sinew-train",
                dir);
  }
  const auto seed = field<std::uint64_t>(config, "seed", 0, dir);
  const model::Shape shape{data.channels, data.height, data.width};
  auto m = [&] {
    try {
      return model::Model::build(spec, shape, data.num_classes, seed);
    } catch (const InvalidArgument& e) {
      SINEW_THROW(InvalidArgument,
                  "checkpoint {}: its model \"{}\" does not fit the data set ({}x{}x{}, {} classes): {}", dir,
                  spec, data.channels, data.height, data.width, data.num_classes, e.message());
    }
  }();
  const auto params = std::find_if(manifest.tensors.begin(), manifest.tensors.end(),
                                   [](const auto& t) { return t.name == "params"; });
  if (params == manifest.tensors.end()) {
    SINEW_THROW(CheckpointError,
                "checkpoint {} holds no \"params\" tensor; use a checkpoint written by sinew-train", dir);
  }
  if (params->size != m.num_params()) {
    // The same spec has another parameter count only on other data: another shape or class count.
    SINEW_THROW(
        InvalidArgument,
        "checkpoint {}: model \"{}\" has {} parameters there but {} on this data set ({}x{}x{}, {} classes); "
        "the teacher must run on the data set it was trained on (--data-dir, or the checkpoint's own)",
        dir, spec, params->size, m.num_params(), data.channels, data.height, data.width, data.num_classes);
  }
  // Only the parameters are read (not the optimiser's state), straight into the model, each byte checked.
  checkpoint::load_into(dir, {checkpoint::ReadTarget{"params", 0, m.params()}});
  return TeacherModel(std::move(m), dir, manifest.meta.step);
}

void TeacherModel::logits(const data::Dataset& data, std::span<const std::size_t> indices,
                          std::vector<float>& out) {
  const auto dim = static_cast<std::size_t>(data.dim());
  if (dim != static_cast<std::size_t>(model_.input_shape().size())) {
    SINEW_THROW(InvalidArgument, "teacher {}: data samples have {} values, the model takes {}", path_, dim,
                model_.input_shape().size());
  }
  const auto k = static_cast<std::size_t>(classes());
  out.resize(k * indices.size());
  for (std::size_t first = 0; first < indices.size(); first += kChunk) {
    const auto part = indices.subspan(first, std::min(kChunk, indices.size() - first));
    batch_.resize(dim * part.size());
    data.gather(part, batch_.data(), nullptr);
    const Eigen::Map<const model::Matrix> x(batch_.data(), static_cast<Eigen::Index>(dim),
                                            static_cast<Eigen::Index>(part.size()));
    const auto& y = model_.forward(x);
    std::copy_n(y.data(), k * part.size(), out.begin() + static_cast<std::ptrdiff_t>(k * first));
  }
}

}  // namespace sinew::distill
