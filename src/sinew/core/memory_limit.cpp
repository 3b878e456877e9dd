#include "sinew/core/memory_limit.hpp"

#include <algorithm>
#include <exception>
#include <fstream>
#include <sstream>
#include <string_view>

namespace sinew {

namespace {

std::optional<std::string> read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!f || !std::getline(f, s)) return std::nullopt;
  return s;
}

/// The value of `key` in a memory.stat file, or 0.
std::uint64_t stat_value(const std::string& path, std::string_view key) {
  std::ifstream f(path);
  std::string k;
  std::uint64_t v = 0;
  while (f >> k >> v)
    if (k == key) return v;
  return 0;
}

std::optional<MemoryLimit> read_cgroup(const std::string& dir, const char* limit_file, const char* used_file,
                                       std::string_view inactive_key) {
  const auto limit = read_line(dir + "/" + limit_file);
  const auto used = read_line(dir + "/" + used_file);
  if (!limit || !used || *limit == "max") return std::nullopt;
  MemoryLimit m;
  m.where = dir;
  try {
    m.limit = std::stoull(*limit);
    m.used = std::stoull(*used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (m.limit >= (std::uint64_t{1} << 60)) return std::nullopt;  // v1's "no limit"
  const std::uint64_t inactive = stat_value(dir + "/memory.stat", inactive_key);
  m.used -= std::min(m.used, inactive);
  return m;
}

}  // namespace

std::optional<MemoryLimit> memory_limit() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {  // hierarchy-id:controllers:path
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::istringstream list(controllers);
    bool memory = false;
    for (std::string c; std::getline(list, c, ',');) memory = memory || c == "memory";
    std::optional<MemoryLimit> m;
    if (memory) {  // cgroup v1
      m = read_cgroup("/sys/fs/cgroup/memory" + path, "memory.limit_in_bytes", "memory.usage_in_bytes",
                      "total_inactive_file");
    } else if (controllers.empty() && std::ifstream("/sys/fs/cgroup/cgroup.controllers")) {  // cgroup v2
      m = read_cgroup("/sys/fs/cgroup" + path, "memory.max", "memory.current", "inactive_file");
    }
    if (m) return m;
  }
  return std::nullopt;
}

}  // namespace sinew
