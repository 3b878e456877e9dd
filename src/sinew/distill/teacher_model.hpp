// A teacher of distillation: any Sinew checkpoint's model, rebuilt from the configuration the checkpoint
// records and run forward on training samples by index. The teacher service (serve/teacher_server.hpp), a
// teacher inside the student's process and a precomputed logit table all compute their logits here.
// Free of gRPC: part of libsinew.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "sinew/data/dataset.hpp"
#include "sinew/model/model.hpp"

namespace sinew::distill {

class TeacherModel {
 public:
  /// Samples per forward pass of logits(): bounds the activations' memory, whatever the request.
  static constexpr std::size_t kChunk = 1024;

  /// `path`: a committed checkpoint directory, or a checkpoint root (its newest committed checkpoint that
  /// verifies). Rebuilds the model from the checkpoint's configuration ("model" spec) for the shape and
  /// class count of `data`, and loads its parameters. Throws CheckpointError naming the path when there is
  /// no usable checkpoint there, InvalidArgument when the model does not fit `data` (another data set).
  static TeacherModel load(const std::string& path, const data::Dataset& data);

  /// The data set options recorded in the configuration of the checkpoint at `path` (directory or root,
  /// as load() takes): what the teacher service loads unless told otherwise. Throws CheckpointError.
  static data::DatasetOptions dataset_options(const std::string& path);

  /// The committed checkpoint that `path` stands for: itself, or the newest one under a checkpoint root.
  /// Throws CheckpointError naming `path` when there is none.
  static std::string resolve(const std::string& path);

  /// The logits of samples `indices` of `data` (the data set load() was given, or one of the same shape):
  /// classes() x indices.size() column-major (one column per sample) into `out`, resized. Computed in
  /// chunks of at most kChunk samples. Throws InvalidArgument on an index >= data.size(). Not thread-safe
  /// (one forward pass at a time, as Model).
  void logits(const data::Dataset& data, std::span<const std::size_t> indices, std::vector<float>& out);

  [[nodiscard]] int classes() const { return model_.num_classes(); }
  [[nodiscard]] const std::string& spec() const { return model_.spec(); }
  [[nodiscard]] std::int64_t step() const { return step_; }
  /// The checkpoint directory it was loaded from (resolved: never a root).
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  TeacherModel(model::Model m, std::string path, std::int64_t step)
      : model_(std::move(m)), path_(std::move(path)), step_(step) {}

  model::Model model_;
  std::string path_;
  std::int64_t step_ = 0;
  std::vector<float> batch_;  // one chunk's inputs, dim x n column-major; kept between calls
};

}  // namespace sinew::distill
