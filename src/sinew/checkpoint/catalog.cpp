#include "sinew/checkpoint/catalog.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "sinew/checkpoint/reader.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {

namespace {

constexpr std::string_view kPrefix = "ckpt-";
constexpr std::string_view kPartialSuffix = ".partial";
constexpr std::size_t kStepDigits = 10;
constexpr int kMaxAttempt = 1000000;

struct Listed {
  Entry entry;
  bool partial = false;
};

/// Directories of `dir` whose names parse_name() accepts, newest first (step, then attempt).
std::vector<Listed> list(const std::string& dir) {
  std::vector<Listed> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code dec;
    const auto name = parse_name(it->path().filename().string());
    if (!name || !it->is_directory(dec)) continue;
    Listed l;
    l.entry.path = it->path().string();
    l.entry.step = name->step;
    l.entry.attempt = name->attempt;
    l.partial = name->partial;
    out.push_back(std::move(l));
  }
  std::sort(out.begin(), out.end(), [](const Listed& a, const Listed& b) {
    return a.entry.step != b.entry.step ? a.entry.step > b.entry.step : a.entry.attempt > b.entry.attempt;
  });
  return out;
}

bool exists_now(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

}  // namespace

std::string checkpoint_name(std::int64_t step, int attempt) {
  return attempt <= 1 ? fmt::format("{}{:010d}", kPrefix, step)
                      : fmt::format("{}{:010d}.{}", kPrefix, step, attempt);
}

std::string partial_name(std::int64_t step) { return checkpoint_name(step) + std::string(kPartialSuffix); }

std::string shard_name(int rank, int world) { return fmt::format("shard-{:05d}-of-{:05d}.h5", rank, world); }

std::optional<Name> parse_name(std::string_view name) {
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  Name out;
  const auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  std::string_view step = name.substr(0, std::min(name.size(), kStepDigits));
  std::string_view rest = name.substr(step.size());
  if (step.size() != kStepDigits || !digits(step)) return std::nullopt;
  if (rest == kPartialSuffix) {
    out.partial = true;
  } else if (!rest.empty()) {
    // ".2", ".3", ...: a later attempt; no leading zero, so that each attempt has one name.
    if (rest.front() != '.') return std::nullopt;
    rest.remove_prefix(1);
    if (!digits(rest) || rest.front() == '0' || rest.size() > 6) return std::nullopt;
    int attempt = 0;
    for (const char c : rest) attempt = attempt * 10 + (c - '0');
    if (attempt < 2 || attempt > kMaxAttempt) return std::nullopt;
    out.attempt = attempt;
  }
  out.step = 0;
  for (const char c : step) out.step = out.step * 10 + (c - '0');
  return out;
}

std::optional<std::int64_t> step_of(std::string_view name, bool partial) {
  const auto n = parse_name(name);
  if (!n || n->partial != partial) return std::nullopt;
  return n->step;
}

std::string checkpoint_path(const std::string& dir, std::int64_t step, int attempt) {
  return (fs::path(dir) / checkpoint_name(step, attempt)).string();
}

std::string partial_path(const std::string& dir, std::int64_t step) {
  return (fs::path(dir) / partial_name(step)).string();
}

bool is_committed(const std::string& path) {
  const fs::path dir(path);
  if (const auto n = parse_name(dir.filename().string()); n && n->partial) return false;
  return exists_now(dir / kCommitFile) || exists_now(dir / kManifestChecksumFile);
}

std::vector<Entry> scan(const std::string& dir, bool check) {
  std::vector<Entry> out;
  for (auto& l : list(dir)) {
    if (l.partial || !is_committed(l.entry.path)) continue;
    l.entry.reason = check ? verify(l.entry.path) : std::string();
    l.entry.valid = l.entry.reason.empty();
    out.push_back(std::move(l.entry));
  }
  return out;
}

std::vector<Entry> scan_uncommitted(const std::string& dir) {
  std::vector<Entry> out;
  for (auto& l : list(dir)) {
    if (!l.partial && is_committed(l.entry.path)) continue;
    l.entry.reason = l.partial ? "an unfinished write of an earlier Sinew version; never loaded, removed by "
                                 "the next writer"
                               : "not committed (no commit record): a write in progress, abandoned or "
                                 "failed; never loaded";
    out.push_back(std::move(l.entry));
  }
  return out;
}

Latest find_latest(const std::string& dir, const FindOptions& options) {
  using Clock = std::chrono::steady_clock;
  // Files another client has just created may take a moment to show (LoadOptions::retry_s): that is
  // always waited for, --resume-wait may allow more.
  const double wait_s = std::max(options.wait_s, LoadOptions{}.retry_s);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  Latest l;
  // Verified newest first, and only until one is valid: verifying reads every byte of a checkpoint, and
  // the older ones are not needed.
  for (auto& listed : list(dir)) {
    Entry& e = listed.entry;
    if (listed.partial || e.step >= options.below_step) continue;
    const auto check = [&] { return options.quick ? quick_check(e.path) : verify(e.path, LoadOptions{0}); };
    if (!is_committed(e.path)) {
      e.reason =
          "not committed (no commit record): a write in progress, abandoned or failed, or its "
          "commit record is on a storage server that cannot be reached";
      l.skipped.push_back(std::move(e));
      continue;
    }
    e.reason = check();
    // Files that are missing may come back (a storage server restarting): wait for them, within the
    // time allowed for the whole search.
    e.missing = e.reason.empty() ? std::vector<std::string>{} : missing_files(e.path);
    if (!e.missing.empty() && Clock::now() < deadline) {
      const auto start = Clock::now();
      if (options.on_wait) options.on_wait(e);
      auto pause = std::chrono::milliseconds(20);
      while (!e.missing.empty() && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
        pause = std::min(pause * 2, std::chrono::milliseconds(500));
        e.missing = missing_files(e.path);
      }
      if (e.missing.empty()) {
        e.reason = check();
        e.missing = e.reason.empty() ? std::vector<std::string>{} : missing_files(e.path);
        if (options.on_found)
          options.on_found(e, std::chrono::duration<double>(Clock::now() - start).count());
      }
    }
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
