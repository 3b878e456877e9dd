// sinew-bench: communication and training benchmarks.
//
//   sinew-bench allreduce   size sweep in the nccl-tests format, vs MPI_Allreduce: Sinew's bucketed path
//                           (--impl mpi), its own ring (ring) or ByteGrad, 8-bit compressed (bytegrad)
//   sinew-bench train-step  mean training-step time of a model (default: MLP 784-512-512-10, batch 64/rank)
//   sinew-bench checkpoint  checkpoint write throughput vs dd with fdatasync on the same filesystem, restore
//   time
//   sinew-bench quantize    the quantiser (ByteGrad's codec, --bits 8|4|2) encode and decode throughput, one
//   process sinew-bench load-data   time to load and normalise a data set (default Fashion-MNIST), one
//   process
//   sinew-bench new-comm    the first MPI_Allreduce on a new communicator against the calls after it: time
//                           and the memory pages it faulted in (after a recovery, Sinew's first step is
//                           such a first call, on the shrunk communicator)
//
// busbw for allreduce = algbw * 2(n-1)/n (nccl-tests' convention), so figures are comparable across rank
// counts; for bytegrad it is the effective bandwidth (of the float buffer, not of the compressed bytes).
// #wrong counts elements that differ from the exact expected sum (inputs are small integers, so any
// correct reduction order gives the exact value); for bytegrad, elements beyond its documented error
// bound. The wire column is the bytes rank 0 sent per byte of buffer (2(n-1)/n for a ring).
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <vector>

#include "common.hpp"
#include "sinew/algo/collectives.hpp"
#include "sinew/algo/quantize.hpp"
#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/checkpoint/writer.hpp"
#include "sinew/comm/bucketer.hpp"
#include "sinew/comm/mpi/backend.hpp"
#include "sinew/comm/ring/backend.hpp"
#include "sinew/config.hpp"
#include "sinew/core/error.hpp"
#include "sinew/core/log.hpp"
#include "sinew/core/timer.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/model/workload.hpp"
#include "sinew/mpi/check.hpp"
#include "sinew/mpi/environment.hpp"
#include "sinew/train/state_mirror.hpp"
#include "sinew/train/trainer.hpp"
#if SINEW_HAVE_CUDA
#include "sinew/comm/nccl/api.hpp"
#include "sinew/comm/nccl/backend.hpp"
#include "sinew/comm/nccl/bucketer.hpp"
#include "sinew/cuda/buffer.hpp"
#include "sinew/cuda/device.hpp"
#endif

namespace po = boost::program_options;
using namespace sinew;

namespace {

struct AllreduceRow {
  std::size_t bytes = 0;
  double sinew_us = 0, mpi_us = 0;
  std::size_t sinew_wrong = 0, mpi_wrong = 0;
  double wire = 0;  ///< bytes rank 0 sent per byte of buffer; 0 when unknown (inside MPI)
};

void fill(std::vector<float>& v, int rank) {
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((rank + 1) * ((i % 7) + 1));
}

/// Elements further than `tol` from the exact sum of fill(); NaN counts as wrong.
std::size_t count_wrong(const std::vector<float>& v, int world, float tol) {
  const float ranks_sum = static_cast<float>(world * (world + 1)) / 2;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < v.size(); ++i)
    wrong += !(std::abs(v[i] - ranks_sum * static_cast<float>((i % 7) + 1)) <= tol);
  return wrong;
}

/// Times `op` (collective, all ranks): warm-up, then iterations; returns the slowest rank's mean in us.
template <class Op>
double time_collective(MPI_Comm comm, int warmup, int iters, Op&& op) {
  for (int i = 0; i < warmup; ++i) op();
  SINEW_MPI(MPI_Barrier(comm));
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) op();
  double us = seconds_since(t0) * 1e6 / iters;
  SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, comm));
  return us;
}

int bench_allreduce(const std::vector<std::string>& args, const mpi::Communicator& world) {
  std::size_t min_bytes = 8, max_bytes = 64u << 20, layer_kib = 256, chunk = 1024;
  double bucket_mb = 4;
  int iters = 20, warmup = 3;
  bool overlap = true;
  std::string json, impl = "mpi";
  po::options_description d("sinew-bench allreduce");
  d.add_options()("min-bytes", po::value(&min_bytes)->default_value(min_bytes), "smallest message")(
      "max-bytes", po::value(&max_bytes)->default_value(max_bytes), "largest message (doubling)")(
      "bucket-mb", po::value(&bucket_mb)->default_value(bucket_mb), "Sinew bucket size in MiB")(
      "layer-kib", po::value(&layer_kib)->default_value(layer_kib),
      "size of the simulated per-layer gradient ranges")(
      "overlap", po::value(&overlap)->default_value(overlap), "reduce on the communication thread")(
      "iters", po::value(&iters)->default_value(iters), "timed iterations per size")(
      "warmup", po::value(&warmup)->default_value(warmup), "untimed iterations per size")(
      "impl", po::value(&impl)->default_value(impl),
      "mpi (bucketed MPI_Allreduce, the training path), ring (Sinew's ring), bytegrad (8-bit compressed), "
      "nccl (GPU buffers, bucketed NCCL allreduce: the --device cuda path)")(
      "chunk", po::value(&chunk)->default_value(chunk), "bytegrad: elements per quantisation chunk")(
      "json", po::value(&json), "also write the rows as JSON to this file");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "{}; see sinew-bench allreduce --help", e.what());
  }
  if (min_bytes < 4 || max_bytes < min_bytes || iters < 1 || warmup < 0 || layer_kib < 1 ||
      !(bucket_mb > 0) || chunk < 1 ||
      (impl != "mpi" && impl != "ring" && impl != "bytegrad" && impl != "nccl")) {
    SINEW_THROW(InvalidArgument,
                "sinew-bench allreduce: need 4 <= min-bytes <= max-bytes, iters >= 1, warmup >= 0, "
                "layer-kib >= 1, bucket-mb > 0, chunk >= 1, impl mpi, ring, bytegrad or nccl");
  }
  const char* label = impl == "mpi" ? "sinew" : impl.c_str();
  const int rank = world.rank(), n = world.size();
  comm::mpi::MpiBackend backend(world);
#if SINEW_HAVE_CUDA
  // The GPU path: buffers in device memory, NCCL bootstrapped over the MPI backend (as a fabric does).
  std::optional<comm::nccl::NcclBackend> nccl;
  if (impl == "nccl") {
    sinew::cuda::select_device(world.get());
    nccl.emplace(backend, comm::nccl::real_api(), comm::Options{});
  }
#else
  if (impl == "nccl")
    SINEW_THROW(InvalidArgument, "sinew-bench allreduce --impl nccl: this build of Sinew has no GPU support");
#endif
  mpi::Communicator plain = world.dup();
  const double factor = 2.0 * (n - 1) / n;
  if (rank == 0) {
    const std::string setup =
        impl == "mpi"    ? fmt::format("bucket {:.1f} MiB, overlap {}, layer ranges {} KiB", bucket_mb,
                                    overlap ? "on" : "off", layer_kib)
        : impl == "ring" ? std::string("ring on the whole buffer")
        : impl == "nccl" ? fmt::format(
                               "NCCL on GPU buffers, bucket {:.1f} MiB, layer ranges {} KiB; "
                               "MPI_Allreduce on host buffers (the CPU path)",
                               bucket_mb, layer_kib)
                         : fmt::format("bytegrad on the whole buffer, chunk {}", chunk);
    std::printf("# sinew-bench allreduce: %d ranks, %s, %s\n", n, mpi::library_version().c_str(),
                setup.c_str());
    std::printf("# busbw = algbw * 2(n-1)/n\n");
    std::printf("#%10s %12s %6s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %6s %6s\n", "", "", "", "", label,
                "", "", "", "MPI_Allreduce", "", "", "", "", "");
    std::printf("#%10s %12s %6s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %6s %6s\n", "size", "count",
                "type", "redop", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
                "ratio", "wire");
    std::printf("#%10s %12s %6s %6s | %10s %8s %8s %6s | %10s %8s %8s %6s | %6s %6s\n", "(B)", "(elements)",
                "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", "busbw", "(B/B)");
  }
  std::vector<AllreduceRow> rows;
  for (std::size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float> buf(count);
    // Gradient ranges as backward would report them: last "layer" first, each adjacent to the previous.
    const std::size_t layer = std::max<std::size_t>(layer_kib * 1024 / sizeof(float), 1);
    std::vector<Slice> ranges;
    for (std::size_t end = count; end > 0;) {
      const std::size_t len = std::min(layer, end);
      ranges.push_back({end - len, len});
      end -= len;
    }
    comm::BucketOptions bo;
    bo.bucket_bytes = static_cast<std::size_t>(bucket_mb * (1 << 20));
    bo.overlap = overlap;
    std::optional<comm::GradientBucketer> bucketer;
    if (impl == "mpi") bucketer.emplace(backend, buf, ranges, bo);
#if SINEW_HAVE_CUDA
    std::optional<sinew::cuda::DeviceBuffer<float>> dev;
    std::optional<comm::nccl::DeviceBucketer> dev_bucketer;
    if (nccl) {
      dev.emplace(count);
      dev->zero(nccl->stream());
      comm::nccl::DeviceBucketOptions dbo;
      dbo.bucket_bytes = bo.bucket_bytes;
      dev_bucketer.emplace(*nccl, dev->data(), count, ranges, std::move(dbo));
    }
#endif
    algo::CommStats stats;
    comm::ring::RingBackend ring(backend, &stats);
    const auto reduce = [&] {
      if (impl == "ring") {
        ring.allreduce_sync(comm::Buffer::of(std::span<float>(buf)), comm::ReduceOp::kSum, bo.op);
      } else if (impl == "bytegrad") {
        algo::compressed_allreduce(backend, buf, chunk, {}, bo.op, &stats);
      } else if (impl == "nccl") {
#if SINEW_HAVE_CUDA
        for (const auto& r : ranges) dev_bucketer->mark_ready(r, nullptr);  // final at once
        dev_bucketer->finish();
#endif
      } else {
        for (const auto& r : ranges) bucketer->mark_ready(r);
        bucketer->finish();
      }
    };
    AllreduceRow row;
    row.bytes = bytes;
    // Timed on the zero buffer: repeated sums stay finite, which bytegrad needs, and its codec does the
    // same work on constant chunks.
    row.sinew_us = time_collective(world.get(), warmup, iters, reduce);
    fill(buf, rank);
    stats = {};
#if SINEW_HAVE_CUDA
    if (dev) dev->upload(buf, nccl->stream());
    reduce();
    if (dev) dev->download(buf, nccl->stream());
#else
    reduce();
#endif
    // ByteGrad's bound (algo/collectives.hpp) with fill()'s ranges, 6(k+1) at rank k and 6n(n+1)/2 for
    // the sum: sum_k 6(k+1)/510 + 6n(n+1)/2/510, plus 1 % for the first stage's error in the sum.
    const float tol = impl == "bytegrad" ? 6.f * static_cast<float>(n * (n + 1)) / 510.f * 1.01f : 0.f;
    row.sinew_wrong = count_wrong(buf, n, tol);
    if (impl != "mpi") row.wire = static_cast<double>(stats.bytes_sent) / static_cast<double>(bytes);
    row.mpi_us = time_collective(world.get(), warmup, iters, [&] {
      SINEW_MPI(
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, plain.get()));
    });
    fill(buf, rank);
    SINEW_MPI(
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, plain.get()));
    row.mpi_wrong = count_wrong(buf, n, 0.f);
    std::size_t wrong[2] = {row.sinew_wrong, row.mpi_wrong};
    SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, wrong, 2, MPI_UINT64_T, MPI_SUM, world.get()));
    row.sinew_wrong = wrong[0];
    row.mpi_wrong = wrong[1];
    rows.push_back(row);
    if (rank == 0) {
      const double alg_s = static_cast<double>(bytes) / row.sinew_us / 1e3,
                   alg_m = static_cast<double>(bytes) / row.mpi_us / 1e3;
      const std::string wire = row.wire > 0 ? fmt::format("{:.3f}", row.wire) : "-";
      std::printf(" %10zu %12zu %6s %6s | %10.1f %8.3f %8.3f %6zu | %10.1f %8.3f %8.3f %6zu | %6.2f %6s\n",
                  bytes, count, "float", "sum", row.sinew_us, alg_s, alg_s * factor, row.sinew_wrong,
                  row.mpi_us, alg_m, alg_m * factor, row.mpi_wrong, row.mpi_us / row.sinew_us, wire.c_str());
      std::fflush(stdout);
    }
  }
  std::size_t total_wrong = 0;
  double big_ratio_sum = 0;
  int big = 0;
  for (const auto& r : rows) {
    total_wrong += r.sinew_wrong + r.mpi_wrong;
    if (r.bytes >= (4u << 20)) {
      big_ratio_sum += r.mpi_us / r.sinew_us;
      ++big;
    }
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %zu %s\n", total_wrong, total_wrong == 0 ? "OK" : "FAILED");
    if (big > 0)
      std::printf("# %s/MPI busbw ratio, mean over sizes >= 4 MiB: %.3f\n", label, big_ratio_sum / big);
    if (!json.empty()) {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& r : rows) {
        j.push_back({{"bytes", r.bytes},
                     {"ranks", n},
                     {"impl", impl},
                     {"wire_bytes_per_byte", r.wire},
                     {"sinew_us", r.sinew_us},
                     {"mpi_us", r.mpi_us},
                     {"sinew_busbw_gbs", static_cast<double>(r.bytes) / r.sinew_us / 1e3 * factor},
                     {"mpi_busbw_gbs", static_cast<double>(r.bytes) / r.mpi_us / 1e3 * factor},
                     {"sinew_wrong", r.sinew_wrong},
                     {"mpi_wrong", r.mpi_wrong}});
      }
      std::ofstream(json) << j.dump(2) << "\n";
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

int bench_train_step(const std::vector<std::string>& args, const mpi::Communicator& world) {
  train::Config c;
  c.model = "mlp";
  c.batch_size = 64;
  c.max_steps = 300;
  c.limit_test = 1000;
  c.progress = false;
  c.log_every = 1000000;
  std::string json;
  int warmup_steps = 30;
  po::options_description d("sinew-bench train-step");
  d.add_options()("model", po::value(&c.model)->default_value(c.model), "model")(
      "dataset", po::value(&c.dataset)->default_value(c.dataset), "data set")(
      "data-dir", po::value(&c.data_dir), "data directory")(
      "batch-size", po::value(&c.batch_size)->default_value(c.batch_size), "per rank")(
      "steps", po::value(&c.max_steps)->default_value(c.max_steps), "timed steps")(
      "warmup", po::value(&warmup_steps)->default_value(warmup_steps), "untimed steps first")(
      "optimizer", po::value(&c.optimizer)->default_value(c.optimizer), "sgd | adam")(
      "device", po::value(&c.device)->default_value(c.device), "cpu | cuda")(
      "bucket-mb", po::value(&c.bucket_mb)->default_value(c.bucket_mb), "bucket size")(
      "overlap", po::value(&c.overlap)->default_value(c.overlap), "overlap communication")(
      "checkpoint-dir", po::value(&c.checkpoint_dir), "also checkpoint into this directory")(
      "checkpoint-every", po::value(&c.checkpoint_every)->default_value(c.checkpoint_every), "steps")(
      "checkpoint-async", po::value(&c.checkpoint_async)->default_value(c.checkpoint_async),
      "in the background")("json", po::value(&json), "also write the result as JSON to this file");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "{}; see sinew-bench train-step --help", e.what());
  }
  c.resume = "never";
  c.checkpoint_keep = 2;
  train::validate(c);
  // Warm-up run (page faults, first-touch, MPI connections), then the timed run of the same configuration.
  train::Config warm = c;
  warm.max_steps = warmup_steps;
  warm.checkpoint_dir.clear();
  warm.checkpoint_every = 0;
  train::Trainer(warm, world, model::make_workload).run();
  const auto s = train::Trainer(c, world, model::make_workload).run();
  if (world.rank() == 0) {
    std::printf("# sinew-bench train-step: %s on %s, %d ranks x batch %zu, %s, %lld steps\n", c.model.c_str(),
                c.dataset.c_str(), world.size(), c.batch_size, c.optimizer.c_str(),
                static_cast<long long>(s.steps));
    std::printf("%-8s %6s %6s %12s %12s %14s\n", "impl", "ranks", "batch", "step_ms", "comm_ms", "samples/s");
    std::printf("%-8s %6d %6zu %12.3f %12.3f %14.0f\n", c.device == "cuda" ? "sinew-gpu" : "sinew",
                world.size(), c.batch_size, s.step_ms, s.comm_ms, s.samples_per_s);
    if (!c.checkpoint_dir.empty()) {
      const double ckpt = s.checkpoint_ms / static_cast<double>(s.steps);
      std::printf(
          "# checkpoint every %lld steps (%s): %.3f ms per step on the training thread, %.2f%% of the step\n",
          static_cast<long long>(c.checkpoint_every), c.checkpoint_async ? "async" : "sync", ckpt,
          100.0 * ckpt / s.step_ms);
    }
    if (!json.empty()) {
      std::ofstream(json) << nlohmann::json{{"impl", "sinew"},
                                            {"device", c.device},
                                            {"model", c.model},
                                            {"ranks", world.size()},
                                            {"batch", c.batch_size},
                                            {"step_ms", s.step_ms},
                                            {"comm_ms", s.comm_ms},
                                            {"samples_per_s", s.samples_per_s},
                                            {"checkpoint_ms_per_step",
                                             s.checkpoint_ms / static_cast<double>(s.steps)},
                                            {"checkpoint", c.checkpoint_dir.empty()
                                                               ? "none"
                                                               : (c.checkpoint_async ? "async" : "sync")}}
                                 .dump()
                          << "\n";
    }
  }
  return 0;
}

/// Runs `sh -c cmd` and returns its exit status. posix_spawn (vfork-like) rather than system()'s fork:
/// a fork would mark every page of this process copy-on-write, and the first write to each afterwards
/// (into a shard image, into the restored tensors) would take a page fault inside the timed regions.
int run_shell(const std::string& cmd) {
  const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = 0;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-const-cast): posix_spawn's argv is not const-correct
  if (::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char* const*>(argv), environ) != 0)
    return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Wall time of `dd` writing `bytes` with fdatasync into `dir`: the peer of the checkpoint write.
double dd_seconds(const std::string& dir, std::uint64_t bytes) {
  const std::string file = dir + "/dd-peer.bin";
  const std::string cmd = fmt::format("dd if=/dev/zero of='{}' bs=1M count={} conv=fdatasync status=none",
                                      file, std::max<std::uint64_t>(bytes >> 20, 1));
  const auto t0 = Clock::now();
  const int rc = run_shell(cmd);
  const double s = seconds_since(t0);
  std::filesystem::remove(file);
  if (rc != 0) SINEW_THROW(Error, "sinew-bench checkpoint: '{}' failed", cmd);
  return s;
}

int bench_checkpoint(const std::vector<std::string>& args, const mpi::Communicator& world) {
  double mb = 256;
  int rounds = 3;
  std::string dir, json;
  po::options_description d("sinew-bench checkpoint");
  d.add_options()("dir", po::value(&dir), "directory on the filesystem to measure (required)")(
      "mb", po::value(&mb)->default_value(mb), "checkpoint size in MiB (params + momentum, like SGD)")(
      "rounds", po::value(&rounds)->default_value(rounds), "alternating rounds of Sinew and dd")(
      "json", po::value(&json), "also write the result as JSON to this file");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "{}; see sinew-bench checkpoint --help", e.what());
  }
  if (dir.empty() || !(mb > 0) || rounds < 1) {
    SINEW_THROW(InvalidArgument, "sinew-bench checkpoint: need --dir, --mb > 0 and --rounds >= 1");
  }
  comm::mpi::MpiBackend backend(world);
  checkpoint::WriterOptions wo;
  wo.keep = 0;  // each round removes its checkpoint itself, outside the timed regions
  const std::string ckdir = dir + "/sinew-bench-ckpt";
  checkpoint::Writer writer(ckdir, backend, wo);
  checkpoint::TrainingState st;
  const auto n = static_cast<std::size_t>(mb * (1 << 20) / sizeof(float) / 2);
  for (const char* name : {"params", "optim/momentum"}) {
    auto& v = st.tensors[name];
    v.resize(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 1000) * 0.001f;
  }
  st.world_size = world.size();
  // Cold-cache figures need the page cache dropped (root, a writable /proc/sys/vm/drop_caches).
  const bool can_drop = world.rank() != 0 || ::access("/proc/sys/vm/drop_caches", W_OK) == 0;
  int cold = can_drop ? 1 : 0;
  SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, &cold, 1, MPI_INT, MPI_MIN, world.get()));
  auto drop_caches = [&] {
    if (world.rank() == 0) {
      ::sync();
      std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
    }
    SINEW_MPI(MPI_Barrier(world.get()));
  };
  // Seconds until every rank is done with `f`.
  auto timed = [&](auto&& f) {
    SINEW_MPI(MPI_Barrier(world.get()));
    const auto t0 = Clock::now();
    f();
    double s = seconds_since(t0);
    SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, world.get()));
    return s;
  };
  std::vector<double> sinew_gbs, dd_gbs, warm_gbs, dd_warm_gbs, cold_gbs, dd_cold_gbs;
  std::uint64_t bytes = 0, files_bytes = 0;
  // A job checkpoints again and again: the first save (which allocates and maps the shard's memory, kept
  // by the writer for the next one) is not timed.
  // On virtual machines the first use of a physical page is slow (the host maps it): Sinew and dd each
  // write into page cache just freed by removing the previous output, so neither meets fresh pages.
  st.step = 0;
  const auto warmup = writer.save(st);
  std::error_code ec;
  if (world.rank() == 0) std::filesystem::remove_all(warmup.path, ec);
  for (int r = 0; r < rounds; ++r) {
    st.step = r + 1;
    checkpoint::SaveResult res;
    const double ws = timed([&] { res = writer.save(st); });
    bytes = res.bytes;
    sinew_gbs.push_back(static_cast<double>(bytes) / ws / 1e9);
    // Restore: every rank reads the whole checkpoint (data-parallel ranks all hold the whole state); the
    // peer is dd reading the same shard files on every rank at once, into /dev/null.
    std::string shards;
    files_bytes = 0;
    for (int k = 0; k < world.size(); ++k) {
      const auto file = std::filesystem::path(res.path) / checkpoint::shard_name(k, world.size());
      shards += fmt::format(" '{}'", file.string());
      files_bytes += std::filesystem::file_size(file);
    }
    const std::string dd_read =
        "for f in" + shards + "; do dd if=\"$f\" of=/dev/null bs=4M status=none || exit 1; done";
    const auto total = static_cast<double>(files_bytes) * world.size();
    // Sinew restores as the trainer does: straight into the live tensors (here `into`, allocated and
    // touched before the clock starts, as a model's are).
    std::map<std::string, std::vector<float>> into;
    std::vector<checkpoint::ReadTarget> targets;
    for (const auto& [name, v] : st.tensors) {
      into[name].assign(v.size(), -1.f);
      targets.push_back({name, 0, into[name]});
    }
    auto restore = [&] { checkpoint::load_into(res.path, targets); };
    auto check = [&] {
      if (into != st.tensors) SINEW_THROW(Error, "sinew-bench checkpoint: restored state differs");
      for (auto& [name, v] : into) std::fill(v.begin(), v.end(), -1.f);
    };
    auto dd_restore = [&] {
      if (run_shell(dd_read) != 0) SINEW_THROW(Error, "sinew-bench checkpoint: '{}' failed", dd_read);
    };
    // Warm: the files are in the page cache (just written, then read once).
    // Warm: the files are in the page cache, and the destination is memory in use, as a model's is (one
    // restore untimed: the first writes into freshly allocated memory are slow on these machines).
    dd_restore();
    restore();
    warm_gbs.push_back(total / timed(restore) / 1e9);
    check();
    dd_warm_gbs.push_back(total / timed(dd_restore) / 1e9);
    if (cold) {
      drop_caches();
      cold_gbs.push_back(total / timed(restore) / 1e9);
      check();
      drop_caches();
      dd_cold_gbs.push_back(total / timed(dd_restore) / 1e9);
    }
    if (world.rank() == 0) std::filesystem::remove_all(res.path, ec);
    double dd = 0;
    if (world.rank() == 0) dd = static_cast<double>(bytes) / dd_seconds(dir, bytes) / 1e9;
    SINEW_MPI(MPI_Bcast(&dd, 1, MPI_DOUBLE, 0, world.get()));
    dd_gbs.push_back(dd);
  }
  auto median = [](std::vector<double> v) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double sg = median(sinew_gbs), dg = median(dd_gbs), wg = median(warm_gbs), dwg = median(dd_warm_gbs),
               cg = median(cold_gbs), dcg = median(dd_cold_gbs);
  if (world.rank() == 0) {
    std::printf("# sinew-bench checkpoint: %d ranks, %.1f MiB per checkpoint, %d rounds, dir %s\n",
                world.size(), static_cast<double>(bytes) / (1 << 20), rounds, dir.c_str());
    std::printf("# restore: every rank reads all %d shard files (%.1f MiB); GB/s over all ranks' bytes\n",
                world.size(), static_cast<double>(files_bytes) / (1 << 20));
    std::printf("%-6s %10s %10s %7s %10s %10s %7s %10s %10s %7s\n", "round", "write", "dd_write", "ratio",
                "rd_warm", "dd_warm", "ratio", "rd_cold", "dd_cold", "ratio");
    for (int r = 0; r < rounds; ++r) {
      const auto i = static_cast<std::size_t>(r);
      const double c = cold ? cold_gbs[i] : std::numeric_limits<double>::quiet_NaN();
      const double dc = cold ? dd_cold_gbs[i] : std::numeric_limits<double>::quiet_NaN();
      std::printf("%-6d %10.3f %10.3f %7.2f %10.3f %10.3f %7.2f %10.3f %10.3f %7.2f\n", r + 1, sinew_gbs[i],
                  dd_gbs[i], sinew_gbs[i] / dd_gbs[i], warm_gbs[i], dd_warm_gbs[i],
                  warm_gbs[i] / dd_warm_gbs[i], c, dc, c / dc);
    }
    std::printf(
        "# median GB/s: write %.3f vs dd (fdatasync) %.3f = %.2fx; restore warm %.3f vs dd %.3f = %.2fx; "
        "restore cold %.3f vs dd %.3f = %.2fx%s\n",
        sg, dg, sg / dg, wg, dwg, wg / dwg, cg, dcg, cg / dcg,
        cold ? "" : " (cold: cannot drop the page cache here, needs root)");
    if (!json.empty()) {
      auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
      std::ofstream(json) << nlohmann::json{{"ranks", world.size()},
                                            {"bytes", bytes},
                                            {"dir", dir},
                                            {"sinew_gbs", sg},
                                            {"dd_gbs", dg},
                                            {"ratio", sg / dg},
                                            {"restore_warm_gbs", wg},
                                            {"dd_read_warm_gbs", dwg},
                                            {"restore_warm_ratio", wg / dwg},
                                            {"restore_cold_gbs", num(cg)},
                                            {"dd_read_cold_gbs", num(dcg)},
                                            {"restore_cold_ratio", num(cg / dcg)},
                                            {"rounds_sinew_gbs", sinew_gbs},
                                            {"rounds_dd_gbs", dd_gbs}}
                                 .dump()
                          << "\n";
    }
  }
  if (world.rank() == 0) std::filesystem::remove_all(ckdir, ec);
  return 0;
}

/// Parses a benchmark's options into the variables `d` names.
void parse_options(const std::vector<std::string>& args, const po::options_description& d, const char* what) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(d).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    SINEW_THROW(InvalidArgument, "{}; see sinew-bench {} --help", e.what(), what);
  }
}

/// The quantiser's throughput (one process, rank 0): median of `reps` encodes and decodes of `mib` MiB of
/// uniform floats in [-1, 1) at `bits` bits, and #wrong, the elements decoded further than the documented
/// bound (max - min) / (2 (2^bits - 2)) (1 + 2^-15) per chunk plus 4 ulps (tests/unit/test_quantize.cpp
/// checks the bound; this only measures).
int bench_quantize(const std::vector<std::string>& args, const mpi::Communicator& world) {
  double mib = 16;
  std::size_t chunk = 1024;
  int reps = 5;
  int bits = 8;
  po::options_description d("sinew-bench quantize");
  d.add_options()("mib", po::value(&mib)->default_value(mib), "buffer size in MiB of floats")(
      "bits", po::value(&bits)->default_value(bits), "bits per element: 8, 4 or 2")(
      "chunk", po::value(&chunk)->default_value(chunk), "elements per quantisation chunk")(
      "reps", po::value(&reps)->default_value(reps), "timed repetitions (after one warm-up)");
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    if (world.rank() == 0) std::cout << d;
    return 0;
  }
  parse_options(args, d, "quantize");
  if (!(mib > 0) || chunk == 0 || reps < 1)
    SINEW_THROW(InvalidArgument, "sinew-bench quantize: need --mib > 0, --chunk >= 1 and --reps >= 1");
  if (world.rank() != 0) return 0;
  const auto n = static_cast<std::size_t>(mib * (1 << 20) / sizeof(float));
  std::vector<float> x(n), y(n);
  std::uint64_t z = 0x9E3779B97F4A7C15ULL;
  for (auto& v : x) {
    z = z * 6364136223846793005ULL + 1442695040888963407ULL;  // LCG: reproducible, fast
    v = static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.f;
  }
  std::vector<std::byte> bytes(algo::encoded_bytes(n, chunk, bits));  // checks bits and chunk
  auto median_s = [&](auto&& f) {
    f();  // warm-up: first touch
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = Clock::now();
      f();
      t.push_back(seconds_since(t0));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double enc = median_s([&] { algo::encode(x, chunk, bytes, bits); });
  const double dec = median_s([&] { algo::decode(bytes, chunk, y, bits); });
  const float steps = static_cast<float>((1 << bits) - 2);
  std::size_t wrong = 0;
  for (std::size_t b = 0; b < n; b += chunk) {
    const auto first = x.begin() + static_cast<std::ptrdiff_t>(b);
    const auto last = x.begin() + static_cast<std::ptrdiff_t>(std::min(b + chunk, n));
    const auto [lo, hi] = std::minmax_element(first, last);
    const float bound = (*hi - *lo) / (2.f * steps) * (1.f + 0x1p-15f) +
                        4 * std::numeric_limits<float>::epsilon() * std::max(std::abs(*lo), std::abs(*hi));
    for (auto i = b; i < std::min(b + chunk, n); ++i) wrong += !(std::abs(x[i] - y[i]) <= bound);
  }
  const double gb = static_cast<double>(n * sizeof(float)) / 1e9;
  std::printf("# sinew-bench quantize: %.1f MiB of floats, %d bits, chunk %zu, median of %d\n", mib, bits,
              chunk, reps);
  std::printf("%12s %12s %12s %8s\n", "encode_GB/s", "decode_GB/s", "wire_ratio", "#wrong");
  std::printf("%12.2f %12.2f %12.4f %8zu\n", gb / enc, gb / dec,
              static_cast<double>(bytes.size()) / static_cast<double>(n * sizeof(float)), wrong);
  return wrong == 0 ? 0 : 1;
}

/// Time to load a data set (one process, rank 0): decompression, parsing and normalisation.
int bench_load_data(const std::vector<std::string>& args, const mpi::Communicator& world) {
  data::DatasetOptions o;
  int reps = 3;
  po::options_description d("sinew-bench load-data");
  d.add_options()("dataset", po::value(&o.name)->default_value(o.name), "data set name (as sinew-train)")(
      "data-dir", po::value(&o.data_dir), "its directory (default: the data set's own)")(
      "reps", po::value(&reps)->default_value(reps), "loads timed");
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    if (world.rank() == 0) std::cout << d;
    return 0;
  }
  parse_options(args, d, "load-data");
  if (reps < 1) SINEW_THROW(InvalidArgument, "sinew-bench load-data: need --reps >= 1");
  if (world.rank() != 0) return 0;
  std::vector<double> t;
  std::string description;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    const auto split = data::load_dataset(o);
    t.push_back(seconds_since(t0));
    description = split.description;
  }
  std::sort(t.begin(), t.end());
  std::printf("# sinew-bench load-data: %s\n", description.c_str());
  std::printf("%10s %10s %10s\n", "min_s", "median_s", "max_s");
  std::printf("%10.3f %10.3f %10.3f\n", t.front(), t[t.size() / 2], t.back());
  return 0;
}

/// Minor page faults of this process so far (pages the kernel had to map in).
long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

/// The first MPI_Allreduce on each of --comms fresh communicators (MPI_Comm_dup of the world, after warm-up
/// calls on the world) and the --calls after it: the slowest rank's time and the most pages a rank faulted
/// in during the call.
int bench_new_comm(const std::vector<std::string>& args, const mpi::Communicator& world) {
  std::int64_t count = 669706;  // the parameters of the MLP 784-512-512-10
  int comms = 3, calls = 3;
  po::options_description d("sinew-bench new-comm");
  d.add_options()("count", po::value(&count)->default_value(count),
                  "floats per allreduce (default: the MLP's)")(
      "comms", po::value(&comms)->default_value(comms), "fresh communicators")(
      "calls", po::value(&calls)->default_value(calls), "allreduces timed on each");
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    if (world.rank() == 0) std::cout << d;
    return 0;
  }
  parse_options(args, d, "new-comm");
  if (count < 1 || count > std::numeric_limits<int>::max() || comms < 1 || calls < 1)
    SINEW_THROW(InvalidArgument,
                "sinew-bench new-comm: need --count in 1..2^31-1, --comms >= 1, --calls >= 1");
  std::vector<float> buf(static_cast<std::size_t>(count), 1.f);
  const auto timed = [&](MPI_Comm comm) {
    const long f0 = minor_faults();
    const double t0 = MPI_Wtime();
    SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm));
    double r[2] = {(MPI_Wtime() - t0) * 1e3, static_cast<double>(minor_faults() - f0)};
    SINEW_MPI(MPI_Allreduce(MPI_IN_PLACE, r, 2, MPI_DOUBLE, MPI_MAX, comm));
    return std::pair{r[0], r[1]};
  };
  for (int i = 0; i < 5; ++i) timed(world.get());  // the world's first calls fault in their buffers too
  if (world.rank() == 0) {
    std::printf(
        "# sinew-bench new-comm: %d ranks, MPI_Allreduce of %lld floats; ms of the slowest rank, pages "
        "faulted in by the rank that faulted most\n",
        world.size(), static_cast<long long>(count));
    std::printf("%6s %6s %10s %8s\n", "comm", "call", "ms", "faults");
  }
  for (int c = 0; c < comms; ++c) {
    MPI_Comm fresh = MPI_COMM_NULL;
    SINEW_MPI(MPI_Comm_dup(world.get(), &fresh));
    SINEW_MPI(MPI_Barrier(fresh));
    for (int k = 0; k < calls; ++k) {
      const auto [ms, faults] = timed(fresh);
      if (world.rank() == 0) std::printf("%6d %6d %10.3f %8.0f\n", c, k, ms, faults);
    }
    SINEW_MPI(MPI_Comm_free(&fresh));
  }
  return 0;
}

/// The cost of keeping the state in node memory (--state-mirror): one StateMirror::write of parameters and
/// momentum per step, against a plain copy of the same bytes into a private buffer (the least any copy
/// costs), median of --reps, one process (rank 0).
int bench_state_mirror(const std::vector<std::string>& args, const mpi::Communicator& world) {
  std::int64_t count = 669706;  // the parameters of the MLP 784-512-512-10
  std::string dir = "/dev/shm";
  int reps = 50;
  po::options_description d("sinew-bench state-mirror");
  d.add_options()("count", po::value(&count)->default_value(count),
                  "parameters (the momentum is as large; default: the MLP's; ResNet-18 has 11181642)")(
      "dir", po::value(&dir)->default_value(dir), "where the mirror's directory is made (a tmpfs)")(
      "reps", po::value(&reps)->default_value(reps), "writes timed");
  if (std::find(args.begin(), args.end(), "--help") != args.end()) {
    if (world.rank() == 0) std::cout << d;
    return 0;
  }
  parse_options(args, d, "state-mirror");
  if (count < 1 || reps < 1)
    SINEW_THROW(InvalidArgument, "sinew-bench state-mirror: need --count >= 1, --reps >= 1");
  if (world.rank() != 0) return 0;
  const auto n = static_cast<std::size_t>(count);
  std::vector<float> params(n, 1.f), momentum(n, 2.f), copy(2 * n);
  const NamedSpans tensors{{"params", params}, {"optim/momentum", momentum}};
  const std::string sub =
      (std::filesystem::path(dir) / fmt::format("sinew-bench-mirror-{}", ::getpid())).string();
  train::StateMirror mirror(sub, train::StateMirror::layout_hash(tensors, 1, 1));
  train::Position pos;
  auto median_ms = [&](auto&& f) {
    f();  // first touch
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = Clock::now();
      f();
      t.push_back(seconds_since(t0) * 1e3);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  bool ok = true;
  const double mirror_ms = median_ms([&] {
    ++pos.step;
    ok = mirror.write(pos, tensors) && ok;
  });
  const double copy_ms = median_ms([&] {
    std::memcpy(copy.data(), params.data(), n * sizeof(float));
    std::memcpy(copy.data() + n, momentum.data(), n * sizeof(float));
  });
  mirror.remove();
  std::filesystem::remove(sub);
  if (!ok) SINEW_THROW(InvalidArgument, "sinew-bench state-mirror: cannot write a mirror in {}", dir);
  std::printf("# sinew-bench state-mirror: %lld parameters + momentum (%.1f MB) into %s, median of %d\n",
              static_cast<long long>(count), 8.0 * static_cast<double>(n) / 1e6, dir.c_str(), reps);
  std::printf("%12s %12s %10s\n", "mirror_ms", "memcpy_ms", "ratio");
  std::printf("%12.3f %12.3f %10.2f\n", mirror_ms, copy_ms, mirror_ms / copy_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return apps::guarded_main([&] {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
      if (apps::launcher_rank() == 0) {
        std::puts(
            "usage: mpirun -n N sinew-bench allreduce|train-step|checkpoint|quantize|load-data|new-comm|"
            "state-mirror "
            "[options] "
            "(--help after the name lists them)");
      }
      return args.empty() ? 2 : 0;
    }
    const std::string what = args[0];
    args.erase(args.begin());
    if (what != "allreduce" && what != "train-step" && what != "checkpoint" && what != "quantize" &&
        what != "load-data" && what != "new-comm" && what != "state-mirror") {
      SINEW_THROW(InvalidArgument,
                  "sinew-bench: unknown benchmark '{}'; use allreduce, train-step, checkpoint, quantize, "
                  "load-data, new-comm or state-mirror",
                  what);
    }
    mpi::Environment env(&argc, &argv);
    log::init(env.world_rank(), env.world_size(), spdlog::level::warn);
    const auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
    if (what == "checkpoint") return bench_checkpoint(args, world);
    if (what == "quantize") return bench_quantize(args, world);
    if (what == "load-data") return bench_load_data(args, world);
    if (what == "new-comm") return bench_new_comm(args, world);
    if (what == "state-mirror") return bench_state_mirror(args, world);
    return what == "allreduce" ? bench_allreduce(args, world) : bench_train_step(args, world);
  });
}
