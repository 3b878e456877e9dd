// Metrics as JSON Lines: one object per line, flushed as written so that a crashed run keeps what it
// logged. Written by rank 0 only; other ranks hold a disabled writer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <utility>

namespace sinew::train {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  /// Opens `path` (truncated, or appended to when a new rank 0 takes over after a failure); throws
  /// InvalidArgument naming the file if it cannot be created.
  explicit MetricsWriter(const std::string& path, bool append = false);
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  MetricsWriter(MetricsWriter&& o) noexcept : file_(std::exchange(o.file_, nullptr)), opened_(o.opened_) {}
  MetricsWriter& operator=(MetricsWriter&& o) noexcept {
    if (this != &o) {
      if (file_ != nullptr) std::fclose(file_);
      file_ = std::exchange(o.file_, nullptr);
      opened_ = o.opened_;
    }
    return *this;
  }
  ~MetricsWriter();

  [[nodiscard]] bool enabled() const noexcept { return file_ != nullptr; }
  /// Appends one object with a "time" field (seconds since the writer was opened).
  void write(nlohmann::json object);

 private:
  std::FILE* file_ = nullptr;
  double opened_ = 0;
};

}  // namespace sinew::train
