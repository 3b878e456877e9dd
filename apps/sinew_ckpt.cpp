// sinew-ckpt: look into, check, export and compare Sinew checkpoints (docs/checkpoint-format.md).
//
//   sinew-ckpt list DIR [--json]                   committed checkpoints, newest first, each verified
//   sinew-ckpt inspect PATH [--json]               what the manifest says (reads no tensor data)
//   sinew-ckpt verify PATH...                      reads every shard and checks it against the manifest
//   sinew-ckpt export PATH OUT.h5 [--force]        writes one plain HDF5 file (no shards, no virtual
//   datasets) sinew-ckpt diff A B [--tolerance X] [--json]   per tensor max |A-B|, and the scalar fields that
//   differ
//
// It runs without mpirun and never initialises MPI: reading a checkpoint needs no communication, and the
// checkpoint read functions do not touch MPI.
//
// Exit codes (docs/usage.md): 0 success; 1 `diff --tolerance` exceeded; 2 usage error; 4 a checkpoint is
// missing, corrupt or inconsistent (verify: any of them).
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common.hpp"
#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
namespace ck = sinew::checkpoint;
using json = nlohmann::ordered_json;  // keys in the order written
using namespace sinew;

namespace {

constexpr const char* kUsage =
    "usage: sinew-ckpt COMMAND [ARGS]\n"
    "\n"
    "Look into, check, export and compare Sinew checkpoints. Runs without mpirun.\n"
    "\n"
    "commands:\n"
    "  list DIR [--json]                  committed checkpoints in DIR, newest first, each verified\n"
    "                                     (reads all their data); uncommitted directories (no commit\n"
    "                                     record) are shown as ignored\n"
    "  inspect PATH [--json]              what a checkpoint's manifest says: step, epoch, data position,\n"
    "                                     seed, world size, configuration, tensors with per-shard CRC32\n"
    "  verify PATH...                     reads every shard of each checkpoint and checks sizes and CRC32;\n"
    "                                     prints OK or the reason; exit 4 if any is not valid\n"
    "  export PATH OUT.h5 [--force]       writes the checkpoint as one plain HDF5 file (for h5py users);\n"
    "                                     an existing OUT.h5 is only replaced with --force\n"
    "  diff A B [--tolerance X] [--json]  per tensor: size and max |A-B|; scalar fields that differ. With\n"
    "                                     --tolerance, exit 1 if a tensor differs by more than X (or is\n"
    "                                     missing on one side, or differs in size)\n"
    "\n"
    "PATH is a checkpoint directory (DIR/ckpt-0000000120) or its manifest.h5.\n"
    "exit codes: 0 ok, 1 diff above tolerance, 2 usage error, 4 checkpoint missing, corrupt or "
    "inconsistent\n";

// --- argument parsing ------------------------------------------------------------------------------

struct Args {
  std::vector<std::string> positional;
  po::variables_map vm;
  bool help = false;
};

/// Parses a command's arguments: `options` plus any number of positional arguments, of which the command
/// needs between `min_pos` and `max_pos` (named `pos_names` in the message). Throws InvalidArgument.
Args parse_args(const std::string& cmd, const std::vector<std::string>& argv, po::options_description options,
                std::size_t min_pos, std::size_t max_pos, const char* pos_names) {
  Args a;
  options.add_options()("help,h", "this help");
  po::options_description all;
  all.add(options).add_options()("args", po::value(&a.positional));
  po::positional_options_description pos;
  pos.add("args", -1);
  try {
    po::store(po::command_line_parser(argv).options(all).positional(pos).run(), a.vm);
    po::notify(a.vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "sinew-ckpt {}: {}; see sinew-ckpt --help", cmd, e.what());
  }
  a.help = a.vm.count("help") > 0;
  if (!a.help && a.positional.size() < min_pos) {
    SINEW_THROW(InvalidArgument, "sinew-ckpt {}: missing {}; usage: sinew-ckpt {} {}", cmd, pos_names, cmd,
                pos_names);
  }
  if (!a.help && a.positional.size() > max_pos) {
    SINEW_THROW(InvalidArgument, "sinew-ckpt {}: unexpected argument '{}'; usage: sinew-ckpt {} {}", cmd,
                a.positional[max_pos], cmd, pos_names);
  }
  return a;
}

int print_help(const std::string& cmd, const char* synopsis, const po::options_description& options) {
  std::printf("usage: sinew-ckpt %s %s\n", cmd.c_str(), synopsis);
  std::fflush(stdout);
  std::cout << options;
  return 0;
}

// --- formatting helpers ----------------------------------------------------------------------------

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

/// Bytes of the regular files under `dir` (a checkpoint directory); 0 for what cannot be read.
std::uint64_t disk_bytes(const fs::path& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fec;
    if (it->is_regular_file(fec)) {
      const auto n = it->file_size(fec);
      if (!fec) total += n;
    }
  }
  return total;
}

/// Fails with a message naming `path` itself when nothing is there (the library would name the manifest
/// it looked for, which for a mistyped directory is a file in its parent).
void require_exists(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) SINEW_THROW(CheckpointError, "{}: no such checkpoint (not found)", path);
}

/// The configuration as JSON; a string when it is not valid JSON (older writers, hand edits).
json config_of(const std::string& text) {
  if (text.empty()) return json::object();
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_discarded() ? json(text) : j;
}

void print_json(const json& j) {
  // Non-finite doubles (an infinite difference) are written as null by nlohmann::json.
  std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
}

// --- list --------------------------------------------------------------------------------------------

int cmd_list(const std::vector<std::string>& argv) {
  bool as_json = false;
  po::options_description d("sinew-ckpt list options");
  d.add_options()("json", po::bool_switch(&as_json), "machine-readable output");
  const Args a = parse_args("list", argv, d, 1, 1, "DIR");
  if (a.help) return print_help("list", "DIR [--json]", d);
  const std::string dir = a.positional[0];
  if (!fs::is_directory(dir)) SINEW_THROW(CheckpointError, "{}: not a directory (no checkpoints there)", dir);

  struct Row {
    std::string name, path, state, reason;
    std::int64_t step = -1;
    std::optional<std::int64_t> epoch;
    std::optional<std::int32_t> world;
    std::uint64_t bytes = 0;
  };
  std::vector<Row> rows;
  int committed = 0, valid = 0, uncommitted = 0;
  for (const auto& e : ck::scan(dir, /*check=*/true)) {
    Row r;
    r.path = e.path;
    r.name = fs::path(e.path).filename().string();
    r.step = e.step;
    r.state = e.valid ? "valid" : "invalid";
    r.reason = e.reason;
    r.bytes = disk_bytes(e.path);
    try {
      // For an invalid checkpoint the manifest may still be readable (a shard is damaged): show what it says.
      const auto info = ck::read_manifest(e.path);
      r.epoch = info.meta.epoch;
      r.world = info.meta.world_size;
    } catch (const CheckpointError&) {
      // The reason is already in e.reason.
    }
    ++committed;
    valid += e.valid ? 1 : 0;
    rows.push_back(std::move(r));
  }
  for (const auto& e : ck::scan_uncommitted(dir)) {
    Row r;
    r.path = e.path;
    r.name = fs::path(e.path).filename().string();
    r.step = e.step;
    const auto n = ck::parse_name(r.name);
    r.state = n && n->partial ? "partial" : "uncommitted";
    r.reason = e.reason;
    r.bytes = disk_bytes(e.path);
    ++uncommitted;
    rows.push_back(std::move(r));
  }
  // Newest first; at equal steps the committed ones before the others (already in attempt order).
  const auto committed_row = [](const Row& r) { return r.state == "valid" || r.state == "invalid"; };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& x, const Row& y) {
    return x.step != y.step ? x.step > y.step : (committed_row(x) && !committed_row(y));
  });

  if (as_json) {
    json out = {{"dir", dir}, {"checkpoints", json::array()}};
    for (const auto& r : rows) {
      out["checkpoints"].push_back({{"name", r.name},
                                    {"path", r.path},
                                    {"step", r.step},
                                    {"epoch", r.epoch ? json(*r.epoch) : json(nullptr)},
                                    {"world_size", r.world ? json(*r.world) : json(nullptr)},
                                    {"bytes", r.bytes},
                                    {"state", r.state},
                                    {"reason", r.reason}});
    }
    print_json(out);
    return 0;
  }
  std::printf("%s: %d committed (%d valid), %d uncommitted\n", dir.c_str(), committed, valid, uncommitted);
  if (rows.empty()) {
    if (fs::exists(fs::path(dir) / ck::kManifestFile))
      std::printf("(%s is itself a checkpoint: see sinew-ckpt inspect or verify)\n", dir.c_str());
    return 0;
  }
  std::printf("%12s %8s %6s %11s  %-26s %s\n", "STEP", "EPOCH", "WORLD", "SIZE", "NAME", "STATE");
  for (const auto& r : rows) {
    const std::string epoch = r.epoch ? std::to_string(*r.epoch) : "-";
    const std::string world = r.world ? std::to_string(*r.world) : "-";
    std::string state = r.state == "valid"         ? "valid"
                        : r.state == "partial"     ? "partial (ignored)"
                        : r.state == "uncommitted" ? "uncommitted (ignored)"
                                                   : "INVALID: " + r.reason;
    std::printf("%12lld %8s %6s %11s  %-26s %s\n", static_cast<long long>(r.step), epoch.c_str(),
                world.c_str(), human_bytes(r.bytes).c_str(), r.name.c_str(), state.c_str());
  }
  return 0;
}

// --- inspect -------------------------------------------------------------------------------------------

int cmd_inspect(const std::vector<std::string>& argv) {
  bool as_json = false;
  po::options_description d("sinew-ckpt inspect options");
  d.add_options()("json", po::bool_switch(&as_json), "machine-readable output");
  const Args a = parse_args("inspect", argv, d, 1, 1, "PATH");
  if (a.help) return print_help("inspect", "PATH [--json]", d);
  const std::string path = a.positional[0];
  require_exists(path);
  const auto info = ck::read_manifest(path);
  const auto& m = info.meta;
  std::uint64_t elements = 0;
  for (const auto& t : info.tensors) elements += t.size;

  if (as_json) {
    json tensors = json::array();
    for (const auto& t : info.tensors) {
      tensors.push_back({{"name", t.name},
                         {"size", t.size},
                         {"shards", t.shard_crc32.size()},
                         {"shard_offsets", t.shard_offsets},
                         {"shard_crc32", t.shard_crc32}});
    }
    print_json({{"path", path},
                {"schema_version", info.schema_version},
                {"step", m.step},
                {"epoch", m.epoch},
                {"cursor", m.cursor},
                {"dataset_size", m.dataset_size},
                {"seed", m.seed},
                {"optimizer_steps", m.optimizer_steps},
                {"world_size", m.world_size},
                {"config", config_of(m.config_json)},
                {"tensors", tensors}});
    return 0;
  }
  std::printf("checkpoint       %s\n", path.c_str());
  std::printf("schema version   %d\n", info.schema_version);
  std::printf("step             %lld (optimizer steps %lld)\n", static_cast<long long>(m.step),
              static_cast<long long>(m.optimizer_steps));
  std::printf("epoch            %lld\n", static_cast<long long>(m.epoch));
  if (m.dataset_size > 0) {
    std::printf("cursor           %llu / %llu samples of the epoch (%.1f%%)\n",
                static_cast<unsigned long long>(m.cursor), static_cast<unsigned long long>(m.dataset_size),
                100.0 * static_cast<double>(m.cursor) / static_cast<double>(m.dataset_size));
  } else {
    std::printf("cursor           %llu / %llu samples of the epoch\n",
                static_cast<unsigned long long>(m.cursor), static_cast<unsigned long long>(m.dataset_size));
  }
  std::printf("seed             %llu\n", static_cast<unsigned long long>(m.seed));
  std::printf("world size       %d (ranks that wrote it; it loads at any world size)\n", m.world_size);
  std::printf("tensors          %zu, %llu elements (%s of float32)\n", info.tensors.size(),
              static_cast<unsigned long long>(elements), human_bytes(elements * sizeof(float)).c_str());
  const json config = config_of(m.config_json);
  std::string pretty = config.is_string() ? config.get<std::string>() : config.dump(2);
  std::string indented;
  for (char c : pretty) indented += c == '\n' ? std::string("\n  ") : std::string(1, c);
  std::printf("config\n  %s\n\n", indented.c_str());

  std::size_t width = 6;
  for (const auto& t : info.tensors) width = std::max(width, t.name.size());
  std::printf("%-*s %12s %6s  %s\n", static_cast<int>(width), "TENSOR", "ELEMENTS", "SHARDS",
              "CRC32 PER SHARD");
  for (const auto& t : info.tensors) {
    std::string crcs;
    for (auto c : t.shard_crc32) crcs += fmt::format("{}{:08x}", crcs.empty() ? "" : " ", c);
    std::printf("%-*s %12llu %6zu  %s\n", static_cast<int>(width), t.name.c_str(),
                static_cast<unsigned long long>(t.size), t.shard_crc32.size(), crcs.c_str());
  }
  return 0;
}

// --- verify --------------------------------------------------------------------------------------------

int cmd_verify(const std::vector<std::string>& argv) {
  po::options_description d("sinew-ckpt verify options");
  const Args a = parse_args("verify", argv, d, 1, std::numeric_limits<std::size_t>::max(), "PATH...");
  if (a.help) return print_help("verify", "PATH...", d);
  int bad = 0;
  for (const auto& path : a.positional) {
    std::string reason;
    try {
      require_exists(path);
      reason = ck::verify(path);
    } catch (const Error& e) {  // verify() reports checkpoint problems; this catches anything else
      reason = e.message();
    }
    if (reason.empty()) {
      std::printf("%s: OK\n", path.c_str());
    } else {
      ++bad;
      std::printf("%s: INVALID: %s\n", path.c_str(), reason.c_str());
    }
    std::fflush(stdout);
  }
  return bad == 0 ? 0 : static_cast<int>(ExitCode::kCheckpoint);
}

// --- export --------------------------------------------------------------------------------------------

int cmd_export(const std::vector<std::string>& argv) {
  bool force = false;
  po::options_description d("sinew-ckpt export options");
  d.add_options()("force", po::bool_switch(&force), "replace OUT.h5 if it exists");
  const Args a = parse_args("export", argv, d, 2, 2, "PATH OUT.h5");
  if (a.help) return print_help("export", "PATH OUT.h5 [--force]", d);
  const std::string& path = a.positional[0];
  const std::string& out = a.positional[1];
  std::error_code ec;
  if (fs::is_directory(out, ec))
    SINEW_THROW(InvalidArgument, "sinew-ckpt export: {} is a directory; give a file name", out);
  if (fs::exists(out, ec) && !force)
    SINEW_THROW(InvalidArgument, "sinew-ckpt export: {} already exists; pass --force to replace it", out);
  // Load (and so verify) first: a corrupt checkpoint must not destroy an existing OUT.
  require_exists(path);
  const auto state = ck::load(path);
  if (force) fs::remove(out, ec);
  ck::export_plain(state, out);
  std::uint64_t elements = 0;
  for (const auto& [_, v] : state.tensors) elements += v.size();
  std::printf("%s: step %lld, %zu tensors, %llu elements, written from %s\n", out.c_str(),
              static_cast<long long>(state.step), state.tensors.size(),
              static_cast<unsigned long long>(elements), path.c_str());
  return 0;
}

// --- diff ----------------------------------------------------------------------------------------------

struct TensorDiff {
  std::string name;
  std::string status;  ///< "same", "differs", "only in A", "only in B", "size differs"
  std::optional<std::uint64_t> size_a, size_b;
  double max_abs = 0;           ///< over elements; +inf where one side is NaN and the other is not
  std::uint64_t differing = 0;  ///< elements that are not bitwise-equal values (NaN == NaN here)
};

TensorDiff compare(const std::string& name, const std::vector<float>* x, const std::vector<float>* y) {
  TensorDiff d;
  d.name = name;
  if (x != nullptr) d.size_a = x->size();
  if (y != nullptr) d.size_b = y->size();
  if (y == nullptr) {
    d.status = "only in A";
    return d;
  }
  if (x == nullptr) {
    d.status = "only in B";
    return d;
  }
  if (x->size() != y->size()) {
    d.status = "size differs";
    return d;
  }
  for (std::size_t i = 0; i < x->size(); ++i) {
    const float p = (*x)[i], q = (*y)[i];
    if (p == q || (std::isnan(p) && std::isnan(q))) continue;
    ++d.differing;
    double diff = std::abs(static_cast<double>(p) - static_cast<double>(q));
    if (std::isnan(diff)) diff = std::numeric_limits<double>::infinity();  // NaN vs number, inf vs inf
    d.max_abs = std::max(d.max_abs, diff);
  }
  d.status = d.differing == 0 ? "same" : "differs";
  return d;
}

int cmd_diff(const std::vector<std::string>& argv) {
  bool as_json = false;
  double tolerance = -1;
  po::options_description d("sinew-ckpt diff options");
  d.add_options()("json", po::bool_switch(&as_json), "machine-readable output")(
      "tolerance", po::value(&tolerance)->value_name("X"),
      "exit 1 if some tensor's max |A-B| exceeds X (or a tensor is missing on one side or differs in size)");
  const Args a = parse_args("diff", argv, d, 2, 2, "A B");
  if (a.help) return print_help("diff", "A B [--tolerance X] [--json]", d);
  const bool has_tolerance = a.vm.count("tolerance") > 0;
  if (has_tolerance && !(tolerance >= 0 && std::isfinite(tolerance)))
    SINEW_THROW(InvalidArgument, "sinew-ckpt diff: --tolerance must be a finite number >= 0");
  require_exists(a.positional[0]);
  require_exists(a.positional[1]);
  const auto sa = ck::load(a.positional[0]);
  const auto sb = ck::load(a.positional[1]);

  std::vector<TensorDiff> tensors;
  std::map<std::string, std::pair<const std::vector<float>*, const std::vector<float>*>> by_name;
  for (const auto& [n, v] : sa.tensors) by_name[n].first = &v;
  for (const auto& [n, v] : sb.tensors) by_name[n].second = &v;
  tensors.reserve(by_name.size());
  for (const auto& [n, p] : by_name) tensors.push_back(compare(n, p.first, p.second));

  // Scalar fields: (name, A, B) for those that differ. world_size differing is normal (resize, restart
  // at another size) but is still shown.
  json scalars = json::array();
  auto field = [&](const char* name, const json& x, const json& y) {
    if (x != y) scalars.push_back({{"field", name}, {"a", x}, {"b", y}});
  };
  field("step", sa.step, sb.step);
  field("epoch", sa.epoch, sb.epoch);
  field("cursor", sa.cursor, sb.cursor);
  field("dataset_size", sa.dataset_size, sb.dataset_size);
  field("seed", sa.seed, sb.seed);
  field("optimizer_steps", sa.optimizer_steps, sb.optimizer_steps);
  field("world_size", sa.world_size, sb.world_size);
  // The configuration is compared as JSON, key by key (a JSON patch from A to B).
  const json ca = config_of(sa.config_json), cb = config_of(sb.config_json);
  if (ca != cb) {
    for (const auto& op : json::diff(ca, cb)) {
      const json::json_pointer ptr(op["path"].get<std::string>());
      const std::string fname = "config" + op["path"].get<std::string>();
      scalars.push_back({{"field", fname},
                         {"a", ca.contains(ptr) ? ca.at(ptr) : json(nullptr)},
                         {"b", cb.contains(ptr) ? cb.at(ptr) : json(nullptr)}});
    }
  }

  std::vector<std::string> exceeded;
  std::size_t differ = 0;
  double max_all = 0;
  for (const auto& t : tensors) {
    if (t.status != "same") ++differ;
    const bool structural = t.status == "only in A" || t.status == "only in B" || t.status == "size differs";
    if (!structural) max_all = std::max(max_all, t.max_abs);
    if (has_tolerance && (structural || t.max_abs > tolerance)) exceeded.push_back(t.name);
  }
  const int rc = exceeded.empty() ? 0 : 1;

  if (as_json) {
    json jt = json::array();
    for (const auto& t : tensors) {
      jt.push_back(
          {{"name", t.name},
           {"status", t.status},
           {"size_a", t.size_a ? json(*t.size_a) : json(nullptr)},
           {"size_b", t.size_b ? json(*t.size_b) : json(nullptr)},
           {"max_abs_diff", t.status == "same" || t.status == "differs" ? json(t.max_abs) : json(nullptr)},
           {"differing", t.differing}});
    }
    print_json({{"a", a.positional[0]},
                {"b", a.positional[1]},
                {"tensors", jt},
                {"scalars", scalars},
                {"tensors_differing", differ},
                {"max_abs_diff", max_all},
                {"tolerance", has_tolerance ? json(tolerance) : json(nullptr)},
                {"exceeded", exceeded}});
    return rc;
  }
  std::printf("A: %s (step %lld, %d ranks)\n", a.positional[0].c_str(), static_cast<long long>(sa.step),
              sa.world_size);
  std::printf("B: %s (step %lld, %d ranks)\n\n", a.positional[1].c_str(), static_cast<long long>(sb.step),
              sb.world_size);
  std::size_t width = 6;
  for (const auto& t : tensors) width = std::max(width, t.name.size());
  std::printf("%-*s %12s %12s %12s\n", static_cast<int>(width), "TENSOR", "ELEMENTS", "MAX |A-B|",
              "DIFFERING");
  for (const auto& t : tensors) {
    if (t.status == "same" || t.status == "differs") {
      std::printf("%-*s %12llu %12.6g %12llu\n", static_cast<int>(width), t.name.c_str(),
                  static_cast<unsigned long long>(*t.size_a), t.max_abs,
                  static_cast<unsigned long long>(t.differing));
    } else {
      const std::string size = t.status == "size differs" ? fmt::format("{} vs {}", *t.size_a, *t.size_b)
                                                          : std::to_string(t.size_a ? *t.size_a : *t.size_b);
      std::printf("%-*s %12s  %s\n", static_cast<int>(width), t.name.c_str(), size.c_str(), t.status.c_str());
    }
  }
  if (scalars.empty()) {
    std::printf("\nscalar fields: identical\n");
  } else {
    std::printf("\nscalar fields that differ:\n");
    for (const auto& s : scalars) {
      std::printf("  %-20s %s vs %s\n", s["field"].get<std::string>().c_str(), s["a"].dump().c_str(),
                  s["b"].dump().c_str());
    }
  }
  std::printf("\n%zu of %zu tensors differ; max |A-B| %.6g\n", differ, tensors.size(), max_all);
  if (has_tolerance) {
    if (exceeded.empty()) {
      std::printf("within tolerance %g\n", tolerance);
    } else {
      std::string names;
      for (const auto& n : exceeded) names += (names.empty() ? "" : ", ") + n;
      std::printf("tolerance %g exceeded by: %s\n", tolerance, names.c_str());
    }
  }
  return rc;
}

int run(int argc, char** argv) {
  if (argc < 2) SINEW_THROW(InvalidArgument, "sinew-ckpt: missing command; see sinew-ckpt --help");
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (cmd == "list") return cmd_list(rest);
  if (cmd == "inspect") return cmd_inspect(rest);
  if (cmd == "verify") return cmd_verify(rest);
  if (cmd == "export") return cmd_export(rest);
  if (cmd == "diff") return cmd_diff(rest);
  SINEW_THROW(InvalidArgument,
              "sinew-ckpt: unknown command '{}'; use list, inspect, verify, export or diff (see --help)",
              cmd);
}

}  // namespace

int main(int argc, char** argv) {
  return apps::guarded_main([&] {
    // Library warnings go to stderr; the tables and JSON on stdout stay clean.
    log::init(0, 1, spdlog::level::warn);
    spdlog::set_pattern("[sinew-ckpt] [%^%l%$] %v");
    return run(argc, argv);
  });
}
