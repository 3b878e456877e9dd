// sinew-sim: runs one scenario of the scale model and prints it as one JSON line (hpc/sim/sim.py runs
// the sweeps, the check against the calibration and the report; docs/scale.md).
//
//   sinew-sim fit     --calibration C.json [--fit-ranks 3]
//   sinew-sim step    --calibration C.json --platform P.json|local --algorithm A --ranks N
//   sinew-sim recover --calibration C.json --platform P.json|local --mode M --failure F --ranks N
//
// Options --cfg=... and --log=... go to SimGrid.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include "sim.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/names.hpp"

namespace po = boost::program_options;
using nlohmann::json;
using namespace sinew::sim;

namespace {

constexpr int kBadInput = 2;

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read " + path);
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw std::invalid_argument(path + " is not valid JSON: " + e.what());
  }
}

int run(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::puts(
        "usage: sinew-sim fit|step|recover [options] [--cfg=SIMGRID_OPTION ...]\n"
        "  fit      print the model's parameters fitted from a calibration\n"
        "  step     simulate one training step of --algorithm at --ranks\n"
        "  recover  simulate the recovery (--mode) from one failure (--failure) at --ranks\n"
        "(--help after the command lists its options)");
    return argc < 2 ? kBadInput : 0;
  }
  const std::string what = argv[1];
  if (what != "fit" && what != "step" && what != "recover") {
    std::fprintf(stderr, "sinew-sim: unknown command '%s'; use fit, step or recover\n", what.c_str());
    return kBadInput;
  }
  // SimGrid's own options pass through; ours are parsed here.
  // SimGrid says what it configures at info level; warnings and errors only, unless --log= says otherwise.
  static std::string quiet = "--log=root.thres:warning";
  std::vector<char*> simgrid_args{argv[0], quiet.data()};
  std::vector<std::string> ours;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--cfg=", 0) == 0 || a.rfind("--log=", 0) == 0) {
      simgrid_args.push_back(argv[i]);
    } else {
      ours.push_back(a);
    }
  }
  std::string calibration, platform = "local", algorithm = "ring", mode = "in-place", failure = "process";
  int ranks = 4, fit_ranks = 4;
  double params = 0, compute_ms = 0, bucket_mb = 0, overhead = 0, codec_gbs = 0, reshard_ns_per_byte = 0,
         plan_ms = 0;
  int shard_replicas = 0, optimizer_buffers = 1, units = 8, prefetch = 1;
  std::string shard_stage = "optimizer";
  Options o;
  po::options_description d("sinew-sim " + what);
  d.add_options()("calibration", po::value(&calibration)->required(), "calibrate.py's measurements (JSON)")(
      "fit-ranks", po::value(&fit_ranks)->default_value(fit_ranks),
      "fit the recovery costs at this many ranks")("platform", po::value(&platform)->default_value(platform),
                                                   "a platforms/*.json file, or local")(
      "ranks", po::value(&ranks)->default_value(ranks), "ranks before any failure")(
      "algorithm", po::value(&algorithm)->default_value(algorithm),
      "ring | tree | bytegrad | decentralized | low-precision-decentralized")(
      "mode", po::value(&mode)->default_value(mode), "in-place | spare | spawn | restart")(
      "failure", po::value(&failure)->default_value(failure), "process (killed) | node (lost)")(
      "params", po::value(&params), "workload: parameters (default: the calibrated model's)")(
      "compute-ms", po::value(&compute_ms),
      "workload: one step's computation per rank, ms (default: calibrated)")(
      "bucket-mb", po::value(&bucket_mb), "workload: gradient bucket size in MB (default: Sinew's 4)")(
      "codec-gbs", po::value(&codec_gbs),
      "GB/s of floats at which a rank sums, quantises and dequantises buffers (default: the calibration "
      "core's; a GPU's for a GPU workload)")(
      "optimizer-buffers", po::value(&optimizer_buffers)->default_value(optimizer_buffers),
      "the optimiser's state buffers per parameter: 1 (SGD's momentum, the calibration's), 2 (Adam's)")(
      "shard-replicas", po::value(&shard_replicas)->default_value(shard_replicas),
      "--shard with this many holders per shard (--shard-replicas); 0: --shard none")(
      "shard-stage", po::value(&shard_stage)->default_value(shard_stage),
      "what --shard-replicas > 0 shards: optimizer (ZeRO-1) | gradients (ZeRO-2) | parameters (ZeRO-3)")(
      "units", po::value(&units)->default_value(units),
      "--shard-stage parameters: the model's units (gathered one at a time), alike in size")(
      "shard-prefetch", po::value(&prefetch)->default_value(prefetch),
      "--shard-stage parameters: units whose gathers are handed over while a unit runs (Sinew's "
      "--shard-prefetch, 0 to 8)")(
      "reshard-ns-per-byte", po::value(&reshard_ns_per_byte)->default_value(0),
      "sharded: a reshard's local work per byte of optimiser state (ZeRO-3: and parameters) a member holds "
      "afterwards (sim.py states it from hpc/bench/results/)")(
      "plan-ms", po::value(&plan_ms)->default_value(0),
      "sharded: Sinew's plan_reshard on one member at this size (sim.py: hpc/sim/plan_reshard_time.json)")(
      "overhead-ms-per-mparam", po::value(&overhead)->default_value(0),
      "CPU ms per step and million parameters beyond the simulated work (sim.py fits it per algorithm)")(
      "sample", po::value(&o.sample)->default_value(o.sample),
      "how much of a uniform pattern is simulated: a ring's first max(4, N/2) steps per phase, an "
      "all-to-all in N messages, and the small messages of agreements and the shrink computed from "
      "their routes (0: simulate all)")(
      "tree-segments", po::value(&o.tree_segments)->default_value(o.tree_segments),
      "pipeline segments of the tree algorithms")("simgrid-fat-tree", po::bool_switch(&o.simgrid_fat_tree),
                                                  "build the fabric with SimGrid's FatTreeZone instead of "
                                                  "sinew-sim's own (same routes; for sim.py check)")(
      "simulate-control", po::bool_switch(&o.simulate_control),
      "simulate the agreements' and the shrink's small messages as flows even when sampling (for sim.py "
      "check)")("help", "this help");
  po::variables_map vm;
  po::store(po::command_line_parser(ours).options(d).run(), vm);
  if (vm.count("help") != 0) {
    std::cout << d << "\n";
    return 0;
  }
  po::notify(vm);
  if (ranks < 1 || ranks > 65536) throw std::invalid_argument("--ranks must be in 1..65536");
  if (fit_ranks < 2) throw std::invalid_argument("--fit-ranks must be at least 2");
  if (o.sample < 0 || o.tree_segments < 1)
    throw std::invalid_argument("--sample >= 0 and --tree-segments >= 1");

  Calibration cal = fit(read_json(calibration), fit_ranks);
  if (vm.count("codec-gbs") != 0) {
    if (codec_gbs <= 0) throw std::invalid_argument("--codec-gbs must be > 0");
    cal.costs.reduce_Bps = cal.costs.encode_Bps = cal.costs.decode_Bps = codec_gbs * 1e9;
  }
  if (what == "fit") {
    std::cout << json{{"workload", {{"params", cal.workload.params}, {"compute_s", cal.workload.compute_s}}},
                      {"fitted", cal.fitted}}
                     .dump(1)
              << "\n";
    return 0;
  }
  Workload w = cal.workload;
  if (vm.count("params") != 0) w.params = params, w.name = "custom";
  if (vm.count("compute-ms") != 0) w.compute_s = compute_ms / 1e3, w.name = "custom";
  if (vm.count("bucket-mb") != 0) w.bucket_bytes = bucket_mb * 1024 * 1024;
  if (w.bucket_bytes <= 0) throw std::invalid_argument("--bucket-mb must be > 0");
  if (overhead < 0) throw std::invalid_argument("--overhead-ms-per-mparam must be >= 0");
  w.overhead_s_per_param = overhead / 1e3 / 1e6;
  if (optimizer_buffers < 0 || shard_replicas < 0 || reshard_ns_per_byte < 0 || plan_ms < 0)
    throw std::invalid_argument(
        "--optimizer-buffers, --shard-replicas, --reshard-ns-per-byte and --plan-ms must be >= 0");
  w.optimizer_buffers = optimizer_buffers;
  w.shard_replicas = shard_replicas;
  w.shard_stage = sinew::parse_name(sinew::train::kShardNames, shard_stage, "--shard-stage");
  if (w.shard_stage == ShardStage::kNone)
    throw std::invalid_argument("--shard-stage none: the unsharded job is --shard-replicas 0");
  if (units < 1) throw std::invalid_argument("--units must be >= 1");
  if (prefetch < 0 || prefetch > 8) throw std::invalid_argument("--shard-prefetch must be in [0, 8]");
  w.units = units;
  w.prefetch = prefetch;
  w.reshard_s_per_byte = reshard_ns_per_byte * 1e-9;
  w.plan_s = plan_ms / 1e3;
  if (w.params <= 0 || w.compute_s < 0) throw std::invalid_argument("--params > 0 and --compute-ms >= 0");
  const Platform p = platform == "local" ? cal.local : load_platform(read_json(platform));

  int sg_argc = static_cast<int>(simgrid_args.size());
  json out{{"platform", p.name},
           {"ranks", ranks},
           {"workload", w.name},
           {"params", w.params},
           {"compute_step_ms", w.compute_s * 1e3},
           {"optimizer_buffers", w.optimizer_buffers},
           {"shard_replicas", w.shard_replicas}};
  if (w.sharded()) out["shard_stage"] = sinew::name_of(sinew::train::kShardNames, w.shard_stage);
  if (w.parameters_sharded()) {
    out["units"] = w.units;
    out["shard_prefetch"] = w.prefetch;
  }
  if (what == "step") {
    const Algorithm a = algorithm_from_name(algorithm);
    if (w.sharded() && a != Algorithm::kRing && a != Algorithm::kTree && a != Algorithm::kByteGrad)
      throw std::invalid_argument(
          "--shard-replicas: Sinew shards the optimiser with ring, tree or bytegrad only");
    if (w.gradients_sharded() && a == Algorithm::kByteGrad)
      throw std::invalid_argument(
          "--shard-stage gradients, parameters with bytegrad: not modelled (Sinew's quantised reduce-scatter "
          "to the holders, algo::compressed_reduce_scatter, is not in the model yet)");
    const StepResult r = simulate_step(sg_argc, simgrid_args.data(), p, cal, w, a, ranks, o);
    out.update({{"algorithm", algorithm_name(a)},
                {"step_ms", r.step_s * 1e3},
                {"compute_ms", r.compute_s * 1e3},
                {"exposed_comm_ms", r.exposed_comm_s * 1e3},
                {"bytes_per_rank", r.bytes_per_rank},
                {"sampled", r.sampled}});
    if (w.sharded()) out["gather_ms"] = r.gather_s * 1e3;
    if (w.gradients_sharded()) out["scatter_ms"] = r.scatter_s * 1e3;
  } else {
    const Mode m = mode_from_name(mode);
    const Failure f = failure_from_name(failure);
    if (p.local && f == Failure::kNode)
      throw std::invalid_argument(
          "--failure node needs a platform file: on 'local' every rank is on the one machine");
    const RecoveryResult r = simulate_recovery(sg_argc, simgrid_args.data(), p, cal, w, m, f, ranks, o);
    json parts = json::object();
    for (const auto& [name, s] : r.parts_s) parts[name] = s * 1e3;
    out.update({{"mode", mode_name(m)},
                {"failure", failure},
                {"parts_ms", parts},
                {"total_ms", r.total_s * 1e3},
                {"ranks_after", r.ranks_after}});
    if (w.sharded()) {
      out["moved_state_bytes"] = r.moved_state_bytes;
      out["moved_state_messages"] = r.moved_state_messages;
      out["broadcast_param_bytes"] = r.broadcast_bytes;
    }
  }
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace

/// SimGrid's sharing solver updates the constraints of a finished flow recursively: at 16 384 ranks that
/// is tens of thousands of frames, past the usual 8 MiB main stack. The main thread's stack is sized
/// when the program starts, so raise the limit and start again (once: SINEW_SIM_STACK marks it).
void ensure_stack(char** argv) {
  constexpr rlim_t kWanted = rlim_t{1} << 30;  // 1 GiB, reserved lazily
  rlimit r{};
  if (getrlimit(RLIMIT_STACK, &r) != 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= kWanted) return;
  // Single-threaded here: SimGrid has not started.
  if (std::getenv("SINEW_SIM_STACK") != nullptr) return;  // NOLINT(concurrency-mt-unsafe)
  r.rlim_cur = r.rlim_max == RLIM_INFINITY ? kWanted : std::min(kWanted, r.rlim_max);
  if (setrlimit(RLIMIT_STACK, &r) != 0) return;
  setenv("SINEW_SIM_STACK", "1", 1);  // NOLINT(concurrency-mt-unsafe)
  execv("/proc/self/exe", argv);      // returns only on failure: go on with the stack there is
}

int main(int argc, char** argv) {
  ensure_stack(argv);
  try {
    return run(argc, argv);
  } catch (const po::error& e) {
    std::fprintf(stderr, "sinew-sim: %s; see sinew-sim %s --help\n", e.what(), argc > 1 ? argv[1] : "");
    return kBadInput;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "sinew-sim: %s\n", e.what());
    return kBadInput;
  } catch (const sinew::InvalidArgument& e) {  // (Sinew's own parsers: --shard-stage)
    std::fprintf(stderr, "sinew-sim: %s\n", e.what());
    return kBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sinew-sim: failed: %s\n", e.what());
    return 1;
  }
}
