#include "sinew/checkpoint/catalog.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "sinew/checkpoint/reader.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {

namespace {

constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kPartialSuffix = ".partial";
constexpr std::size_t kStepDigits = 10;

/// Entries of `dir` whose names step_of() accepts, newest first.
std::vector<Entry> list(const std::string& dir, bool partial) {
  std::vector<Entry> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code dec;
    const auto step = step_of(it->path().filename().string(), partial);
    if (!step || !it->is_directory(dec)) continue;
    Entry e;
    e.path = it->path().string();
    e.step = *step;
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.step > b.step; });
  return out;
}

}  // namespace

std::string checkpoint_name(std::int64_t step) { return fmt::format("{}{:010d}", kPrefix, step); }

std::string partial_name(std::int64_t step) { return checkpoint_name(step) + std::string(kPartialSuffix); }

std::string shard_name(int rank, int world) { return fmt::format("shard-{:05d}-of-{:05d}.h5", rank, world); }

std::optional<std::int64_t> step_of(std::string_view name, bool partial) {
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  if (partial) {
    if (!name.ends_with(kPartialSuffix)) return std::nullopt;
    name.remove_suffix(kPartialSuffix.size());
  }
  if (name.size() != kStepDigits ||
      !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  std::int64_t step = 0;
  for (const char c : name) step = step * 10 + (c - '0');
  return step;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / checkpoint_name(step)).string();
}

std::string partial_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / partial_name(step)).string();
}

std::vector<Entry> scan(const std::string& dir, bool check) {
  std::vector<Entry> out = list(dir, /*partial=*/false);
  for (auto& e : out) {
    e.reason = check ? verify(e.path) : std::string();
    e.valid = e.reason.empty();
  }
  return out;
}

std::vector<Entry> scan_partial(const std::string& dir) {
  std::vector<Entry> out = list(dir, /*partial=*/true);
  for (auto& e : out) e.reason = "a write in progress or abandoned; never loaded, removed by the next writer";
  return out;
}

Latest find_latest(const std::string& dir) {
  Latest l;
  // Verified newest first, and only until one is valid: verifying reads every byte of a checkpoint, and
  // the older ones are not needed.
  for (auto& e : list(dir, /*partial=*/false)) {
    e.reason = verify(e.path);
    e.valid = e.reason.empty();
    if (e.valid) {
      l.found = std::move(e);
      break;
    }
    l.skipped.push_back(std::move(e));
  }
  return l;
}

}  // namespace sinew::checkpoint
