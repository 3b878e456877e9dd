#include "sinew/checkpoint/schema.hpp"

#include <sstream>

#include "sinew/checkpoint/hdf5.hpp"
#include "sinew/core/error.hpp"

namespace sinew::checkpoint::schema {

std::vector<std::string> tensor_names(const TrainingState& state) {
  std::vector<std::string> names;
  for (const auto& [name, _] : state.tensors) {
    if (name.empty() || name.find('\n') != std::string::npos || name.front() == '/' || name.back() == '/') {
      SINEW_THROW(InvalidArgument, "checkpoint: invalid tensor name '{}'", name);
    }
    names.push_back(name);
  }
  return names;
}

void write_meta(hid_t f, const TrainingState& st, const std::vector<std::string>& names,
                const std::string& file) {
  std::string lines;
  for (const auto& n : names) lines += (lines.empty() ? "" : "\n") + n;
  h5::write_attr(f, "schema_version", static_cast<std::int64_t>(kSchemaVersion), file);
  h5::write_attr(f, "step", st.step, file);
  h5::write_attr(f, "epoch", st.epoch, file);
  h5::write_attr(f, "cursor", static_cast<std::uint64_t>(st.cursor), file);
  h5::write_attr(f, "dataset_size", static_cast<std::uint64_t>(st.dataset_size), file);
  h5::write_attr(f, "seed", static_cast<std::uint64_t>(st.seed), file);
  h5::write_attr(f, "optimizer_steps", st.optimizer_steps, file);
  h5::write_attr(f, "world_size", static_cast<std::int64_t>(st.world_size), file);
  h5::write_attr(f, "config_json", st.config_json, file);
  h5::write_attr(f, "tensor_names", lines, file);
  if (!st.workload_state.empty()) h5::write_attr(f, "workload_state", st.workload_state, file);
}

TrainingState read_meta(hid_t f, const std::string& file) {
  TrainingState st;
  st.step = h5::read_attr_i64(f, "step", file);
  st.epoch = h5::read_attr_i64(f, "epoch", file);
  st.cursor = h5::read_attr_u64(f, "cursor", file);
  st.dataset_size = h5::read_attr_u64(f, "dataset_size", file);
  st.seed = h5::read_attr_u64(f, "seed", file);
  st.optimizer_steps = h5::read_attr_i64(f, "optimizer_steps", file);
  st.world_size = static_cast<std::int32_t>(h5::read_attr_i64(f, "world_size", file));
  st.config_json = h5::read_attr_string(f, "config_json", file);
  if (H5Aexists(f, "workload_state") > 0) st.workload_state = h5::read_attr_string(f, "workload_state", file);
  return st;
}

std::vector<std::string> read_tensor_names(hid_t f, const std::string& file) {
  std::vector<std::string> out;
  std::istringstream in(h5::read_attr_string(f, "tensor_names", file));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::uint32_t crc32_of(const float* data, std::size_t n) { return h5::crc32_bytes(data, n * sizeof(float)); }

}  // namespace sinew::checkpoint::schema
