#include "sinew/train/metrics.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <system_error>

#include "sinew/core/error.hpp"

namespace sinew::train {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : file_(std::fopen(path.c_str(), append ? "a" : "w")), opened_(now_s()) {
  if (file_ == nullptr) {
    SINEW_THROW(InvalidArgument, "--metrics: cannot create '{}': {}", path,
                std::generic_category().message(errno));
  }
}

MetricsWriter::~MetricsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsWriter::write(nlohmann::json object) {
  if (file_ == nullptr) return;
  object["time"] = std::round((now_s() - opened_) * 1e3) / 1e3;
  // Wall-clock time too: after a failure of rank 0 another rank appends, with its own "time" origin.
  const double unix_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  object["unix_time"] = std::round(unix_s * 1e3) / 1e3;
  const std::string line = object.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace sinew::train
