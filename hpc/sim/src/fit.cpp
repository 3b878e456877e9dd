// From calibrate.py's measurements to the model's parameters. Each figure is either measured directly
// or what is left of a measured time once the part the simulation itself produces (messages through the
// machine's memory, modelled as its loopback link) is taken out; `fitted` records which.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "sim.hpp"

namespace sinew::sim {

namespace {

using nlohmann::json;

const json& at(const json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw std::invalid_argument("calibration: no '" + key + "' in " + where +
                                "; rerun hpc/sim/calibrate.py to measure it");
  }
  return j.at(key);
}

double num(const json& j, const std::string& key, const std::string& where) {
  const json& v = at(j, key, where);
  if (!v.is_number()) throw std::invalid_argument("calibration: " + where + "." + key + " is not a number");
  return v.get<double>();
}

int tree_depth(int members) { return members <= 1 ? 0 : static_cast<int>(std::floor(std::log2(members))); }

}  // namespace

Platform load_platform(const json& j) {
  Platform p;
  const std::string w = "the platform";
  p.name = at(j, "name", w).get<std::string>();
  p.description = j.value("description", "");
  p.link_Bps = num(j, "link_gbps", w) * 1e9 / 8;
  p.link_latency_s = num(j, "link_latency_us", w) * 1e-6;
  p.overhead_s = num(j, "message_overhead_us", w) * 1e-6;
  p.radix = static_cast<int>(num(j, "switch_radix", w));
  p.taper = j.value("taper", 1.0);
  const json& pfs = at(j, "pfs", w);
  p.pfs.servers = static_cast<int>(num(pfs, "servers", "pfs"));
  p.pfs.disk_Bps = num(pfs, "server_gbps", "pfs") * 1e9 / 8;
  p.pfs.stripes = static_cast<int>(num(pfs, "stripes", "pfs"));
  p.pfs.metadata_op_s = num(pfs, "metadata_op_us", "pfs") * 1e-6;
  p.pfs.metadata_threads = static_cast<int>(num(pfs, "metadata_threads", "pfs"));
  const json& rt = at(j, "runtime", w);
  p.runtime.fanout = static_cast<int>(num(rt, "fanout", "runtime"));
  p.runtime.hop_s = num(rt, "hop_us", "runtime") * 1e-6;
  p.runtime.daemon_start_s = num(rt, "daemon_start_ms", "runtime") * 1e-3;
  const json& det = at(j, "detector", w);
  p.detector.period_s = num(det, "period_ms", "detector") * 1e-3;
  p.detector.timeout_s = num(det, "timeout_ms", "detector") * 1e-3;
  if (p.link_Bps <= 0 || p.radix < 4 || p.pfs.servers < 1 || p.pfs.stripes < 1 || p.runtime.fanout < 1 ||
      p.detector.period_s <= 0 || p.detector.timeout_s <= 0 || p.taper < 1) {
    throw std::invalid_argument("platform " + p.name +
                                ": need link_gbps > 0, switch_radix >= 4, pfs servers and stripes >= 1, "
                                "runtime fanout >= 1, detector period and timeout > 0, taper >= 1");
  }
  if (p.pfs.disk_Bps > p.link_Bps) {
    // pfs_read() moves a group of readers' data over the first reader's link (cluster.cpp).
    throw std::invalid_argument("platform " + p.name +
                                ": pfs server_gbps must not exceed link_gbps (the model "
                                "lets one node's link carry what a server sends)");
  }
  return p;
}

Calibration fit(const json& m, int fit_ranks) {
  Calibration c;
  json& f = c.fitted;
  const std::string n = std::to_string(fit_ranks);

  // The workload: its 1-rank step is all computation.
  const json& step = at(m, "step", "the calibration");
  Workload& w = c.workload;
  w.name =
      "fashion-mnist " + at(at(m, "workload", "the calibration"), "model", "workload").get<std::string>();
  w.params = num(at(m, "workload", "the calibration"), "params", "workload");
  w.compute_s =
      num(at(at(step, "allreduce-mpi", "step"), "1", "step.allreduce-mpi"), "step_ms", "step") / 1e3;
  f["compute_s"] = {w.compute_s, "step.allreduce-mpi.1.step_ms: one rank, no communication"};

  Costs& k = c.costs;
  const json& q = at(at(m, "compute", "the calibration"), "quantize", "compute");
  k.encode_Bps = num(q, "encode_gbs", "quantize") * 1e9;
  k.decode_Bps = num(q, "decode_gbs", "quantize") * 1e9;
  k.reduce_Bps = k.decode_Bps;
  f["encode_Bps"] = {k.encode_Bps, "sinew-bench quantize"};
  f["decode_Bps"] = {k.decode_Bps, "sinew-bench quantize"};
  f["reduce_Bps"] = {k.reduce_Bps, "taken as the decoder's rate (decode-and-add is the same streaming work)"};

  // The machine's memory: a message costs its sender a copy at `bandwidth` on its core, and the
  // loopback's latency. Sinew's ring at n ranks takes 2(n-1) steps of (latency + S/n copied) plus n-1
  // exposed segment sums, the copies and sums slowed by c(n) = ceil(n/cores), the ranks on the busiest
  // core (the ranks go in lockstep, at the pace of the ones that share a core):
  //   T(n, S) - (n-1) sum c(n) = latency * 2(n-1) + (1/bandwidth) * 2(n-1) (S/n) c(n),
  // fitted by least squares with relative weights over every rank count and size up to 16 MiB that
  // sinew-bench measured (larger messages leave the caches and Open MPI's shared-memory fragments).
  Platform& p = c.local;
  p.name = "local";
  p.description = "the calibration machine: every rank on its cores, messages through its memory";
  p.local = true;
  p.cores = static_cast<int>(num(at(m, "machine", "the calibration"), "cores", "machine"));
  p.radix = 4;
  p.runtime.fanout = 32;
  p.detector = {1.0, 3.0};
  double s11 = 0, s12 = 0, s22 = 0, s1y = 0, s2y = 0;
  int rows = 0;
  for (const auto& [ranks, sizes] : at(m, "allreduce", "the calibration").items()) {
    const double procs = std::stod(ranks), contention = std::ceil(procs / p.cores);
    for (const json& row : sizes) {
      const double bytes = num(row, "bytes", "allreduce." + ranks);
      if (bytes > 16.0 * 1024 * 1024) continue;
      const double sum = std::min(bytes / procs, 256.0 * 1024) / k.reduce_Bps;
      const double y = num(row, "ring_ms", "allreduce." + ranks) / 1e3 - (procs - 1) * sum * contention;
      const double x1 = 2 * (procs - 1), x2 = 2 * (procs - 1) * (bytes / procs) * contention,
                   wt = 1 / (y * y);
      s11 += wt * x1 * x1, s12 += wt * x1 * x2, s22 += wt * x2 * x2, s1y += wt * x1 * y, s2y += wt * x2 * y;
      ++rows;
    }
  }
  const double det = s11 * s22 - s12 * s12;
  if (rows < 3 || !(det > 0))
    throw std::invalid_argument("calibration: too few allreduce rows to fit the memory");
  const double latency = (s1y * s22 - s2y * s12) / det, inv_bw = (s11 * s2y - s12 * s1y) / det;
  if (!(inv_bw > 0)) throw std::invalid_argument("calibration: the ring times do not grow with size");
  p.link_latency_s = std::max(0.0, latency);
  p.link_Bps = 1 / inv_bw;
  f["local_latency_s"] = {p.link_latency_s,
                          "fit of allreduce.*.ring_ms (<= 16 MiB): T = 2(n-1)(latency + "
                          "S/n/bandwidth c) + (n-1) sum c, c = ceil(n/cores); " +
                              std::to_string(rows) + " rows"};
  f["local_Bps"] = {p.link_Bps, "same fit"};

  // In-place recoveries at fit_ranks: the software parts of each call (its agreements and broadcast
  // through the machine's memory take the simulated time, a few microseconds).
  const json& rec = at(at(m, "recovery", "the calibration"), n, "recovery");
  // A steady step at `ranks` with the recovery benchmark's algorithm (gradient_allreduce over MPI).
  const auto steady = [&](int ranks) {
    const std::string r = std::to_string(ranks);
    return num(at(at(step, "allreduce-mpi", "step"), r, "step.allreduce-mpi"), "step_ms", "step") / 1e3;
  };
  const double steady_s = steady(fit_ranks);
  const auto in_place = [&](const std::string& mode, int survivors) {
    const json& parts = at(at(rec, mode, "recovery." + n), "parts_ms", "recovery." + n + "." + mode);
    const auto part = [&](const std::string& name) { return parts.value(name, 0.0) / 1e3; };
    InPlaceCosts ip;
    const int hops = 2 * tree_depth(survivors) + 1;
    ip.notice_s = part("detect");
    ip.revoke_s = part("revoke");
    ip.agree_hop_s = part("agree") / hops;
    ip.shrink_s = std::max(0.0, part("shrink") - 2 * part("agree"));
    ip.rebuild_s = part("rebuild");
    ip.sync_s = std::max(0.0, part("state sync") - part("agree") - w.state_bytes() / p.link_Bps);
    ip.other_s = part("other");
    ip.first_step_s = std::max(0.0, part("first step") - steady(survivors));  // at the size it goes on at
    f[mode] = {{"first_step_s", ip.first_step_s},
               {"notice_s", ip.notice_s},
               {"revoke_s", ip.revoke_s},
               {"agree_hop_s", ip.agree_hop_s},
               {"shrink_s", ip.shrink_s},
               {"rebuild_s", ip.rebuild_s},
               {"sync_s", ip.sync_s},
               {"other_s", ip.other_s},
               {"how", "parts_ms of recovery." + n + "." + mode + ": agree over " + std::to_string(hops) +
                           " hops of ERA's tree; shrink less its 2 agreements; sync less its agreement and "
                           "the state through memory"}};
    return ip;
  };
  k.in_place = in_place("in place", fit_ranks - 1);
  k.spare = in_place("spare", fit_ranks);
  k.spawn = in_place("spawn", fit_ranks - 1);

  const json& launch = at(m, "launch", "the calibration");
  k.data_s = num(launch, "load_data_s", "launch");
  k.dataset_bytes = num(launch, "dataset_bytes", "launch");
  const json& grow = at(at(rec, "spawn", "recovery." + n), "grow_ms", "recovery." + n + ".spawn");
  const double agree = k.spawn.agree_hop_s * (2 * tree_depth(fit_ranks) + 1);
  k.spawn_s = num(grow, "spawn_ms", "grow_ms") / 1e3;
  k.merge_s = std::max(0.0, num(grow, "merge_ms", "grow_ms") / 1e3 - agree);
  k.grow_rebuild_s = std::max(0.0, num(grow, "rebuild_ms", "grow_ms") / 1e3 - k.data_s);
  f["spawn"]["spawn_s"] = k.spawn_s;
  f["spawn"]["merge_s"] = k.merge_s;
  f["spawn"]["grow_rebuild_s"] = k.grow_rebuild_s;
  f["data_s"] = {k.data_s, "launch.load_data_s: sinew-bench load-data, median"};

  const json& rs = at(at(rec, "restart", "recovery." + n), "parts_ms", "recovery." + n + ".restart");
  const auto rpart = [&](const std::string& name) { return num(rs, name, "restart.parts_ms") / 1e3; };
  k.exit_s = std::max(0.0, rpart("detect") - k.in_place.notice_s);
  // Process start-up: mpirun of an MPI program that exits at once, at 1..4 processes on this machine,
  // grows by a fixed time per process (the daemon starts them in turn): a straight line over n.
  double ln = 0, lt = 0, lnn = 0, lnt = 0, lc = 0;
  for (const auto& [procs, t] : at(launch, "mpi_init_exit_s", "launch").items()) {
    const double x = std::stod(procs), y = t.get<double>();
    ln += x, lt += y, lnn += x * x, lnt += x * y, lc += 1;
  }
  if (lc < 2)
    throw std::invalid_argument("calibration: launch.mpi_init_exit_s needs 2 or more process counts");
  k.proc_start_s = std::max(0.0, (lc * lnt - ln * lt) / (lc * lnn - ln * ln));
  k.launch_s = std::max(0.0, rpart("relaunch") - k.data_s - fit_ranks * k.proc_start_s);
  k.ckpt_load_s = rpart("checkpoint load");
  k.restart_first_step_s = std::max(0.0, rpart("first step") - steady_s);
  k.replay_steps = static_cast<int>(std::lround(rpart("replay") / steady_s));
  k.ckpt_bytes = num(at(at(m, "checkpoint", "the calibration"), n, "checkpoint"), "disk_bytes", "checkpoint");
  f["restart"] = {{"exit_s", k.exit_s},
                  {"launch_s", k.launch_s},
                  {"proc_start_s", k.proc_start_s},
                  {"ckpt_load_s", k.ckpt_load_s},
                  {"replay_steps", k.replay_steps},
                  {"first_step_s", k.restart_first_step_s},
                  {"ckpt_bytes", k.ckpt_bytes},
                  {"how",
                   "exit = detect less the runtime's notice; process start = slope of launch.mpi_init_exit_s "
                   "over processes; "
                   "launch = relaunch less data loading and the processes' start; "
                   "replay steps = replay / a steady step; "
                   "first step less a steady step"}};
  return c;
}

}  // namespace sinew::sim
