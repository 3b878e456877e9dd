// The elastic runtime for a PyTorch model whose forward and backward the caller computes (a C++ program with
// libtorch, or a Python script through the sinew package): MPI, the group, the session, and the training
// loop that drives it and recovers in place.
//
//   pytorch::Job job(options, command);             // sinew-train's options; how to start a replacement
//   auto work = pytorch::TorchWorkload::of(net, job.optimizer());
//   pytorch::Steps steps;
//   steps.train = [&](std::span<const std::size_t> idx) { ... forward, loss.backward() ...; return loss; };
//   steps.evaluate = [&](std::size_t first, std::size_t last) { ...; return workload::EvalSums{...}; };
//   const train::Summary sum = job.run(*work, train_size, steps);
//   return job.exit(sum.exit_code());
//
// run() is the loop of train/session.hpp: when a rank dies in forward, backward, the optimiser step or
// between steps, the survivors recover in place (the state comes from their memory), redo the step, and grow
// back by spawning `command` (or from hot spares); the step function is simply called again.
#pragma once

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sinew/core/error.hpp"
#include "sinew/data/dataset.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/train/config.hpp"
#include "sinew/train/summary.hpp"
#include "sinew/workload/workload.hpp"

namespace sinew::train {
class Session;
}

namespace sinew::pytorch {

class TorchWorkload;

/// What the caller computes.
struct Steps {
  /// Forward and backward of this rank's samples `indices` of the training set (never empty); returns the
  /// mean loss over them. Gradients are accumulated by autograd into the workload's flat buffer.
  std::function<double(std::span<const std::size_t> indices)> train;
  /// The sums over test samples [first, last) (this rank's shard); empty: no evaluation.
  std::function<workload::EvalSums(std::size_t first, std::size_t last)> evaluate;
  /// Samples in the test set.
  std::size_t test_size = 0;
};

/// A micro-batch to compute: this rank's samples of it, and where it is.
struct MicroBatch {
  std::span<const std::size_t> indices;  ///< never empty; valid until the next call
  std::size_t index = 0, count = 1;      ///< micro-batch `index` of the step's `count` (--global-batch)
  std::int64_t step = 0, epoch = 0;      ///< the step being trained (1-based) and its epoch
};

class Job {
 public:
  /// Parses `options` (sinew-train's: --epochs, --batch-size, --lr, --algorithm, --elastic, --spares,
  /// --checkpoint-dir, ...; InvalidArgument for a bad one), starts MPI and joins the group. `command` is
  /// the command line that starts a replacement (argv of this process; a relative argv[0] stands for this
  /// executable, /proc/self/exe). A spawned process whose spawn
  /// was abandoned exits here with code 0, as sinew-train does.
  Job(const std::vector<std::string>& options, std::vector<std::string> command);
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  Job(Job&&) = delete;
  Job& operator=(Job&&) = delete;
  ~Job();

  /// --help: the option text (the job then has no group; run() must not be called).
  [[nodiscard]] const std::string& help() const noexcept;
  [[nodiscard]] const train::Config& config() const noexcept;
  /// --shard parameters: the model stays sharded when training ends (train::Config::whole_at_end), for a
  /// model that does not fit a rank whole beside the optimiser's shards. Before start_loop().
  void keep_sharded_at_end();
  /// Training ended with the model left sharded (train::Session::kept_sharded).
  [[nodiscard]] bool kept_sharded() const;
  /// The fused optimiser of --optimizer (sgd | adam) and its settings.
  [[nodiscard]] optim::OptimizerOptions optimizer() const;
  /// The data set of --dataset, --data-dir, --limit-train and --limit-test (Sinew's loaders: Fashion-MNIST
  /// from the Debian package by default, MNIST, CSV, synthetic); nothing is downloaded.
  [[nodiscard]] data::DataSplit dataset() const;
  /// This process's place in the group (they change when the group does).
  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;

  /// Trains `work` over a training set of `train_size` samples until the session is done (the loop of
  /// train/session.hpp, recovering in place from every rank failure) and returns the summary. Once. It is
  /// start(), then next() and steps.train until next() says done, recover() on a CommFailure, finish().
  train::Summary run(TorchWorkload& work, std::size_t train_size, const Steps& steps);

  // ---- the same loop, driven by the caller (the Python package's ElasticSampler) -----------------------
  /// Builds the session over `work` (which must outlive the job; steps.evaluate is called when an epoch
  /// ends). `steps.train`, if given, is run once first, on the first --batch-size samples, to lay the flat
  /// buffers out in backward's order (TorchWorkload::probe_ready_order: the buckets follow it), and for
  /// --algorithm auto's measure, which is refused without it. A hot spare waits here until it is promoted
  /// (true) or the run ends (false: call finish()).
  bool start(TorchWorkload& work, std::size_t train_size, const Steps& steps);
  /// The next micro-batch to compute, or nothing when the run is over. `loss` is the mean loss over the
  /// micro-batch the previous call returned (ignored after a recovery). Ends steps (the reduction, the
  /// update, the boundary) and evaluates as needed. May throw CommFailure: call recover(), then next().
  std::optional<MicroBatch> next(double loss);
  /// In place after a CommFailure out of next() or the caller's computation; the lost step is redone.
  void recover(const CommFailure& e);
  // ---- the caller's own loop: forward, backward and the optimiser's step are the script's -------------
  // (the Python package's DDP-style loop). start_loop(), then for every step: settle() (the last step's
  // update if the script made it by hand, the step boundary, the evaluation and the epoch's end), begin()
  // (the step's samples), reduce() when backward is over, update() for the optimiser's step. Any of them
  // may throw CommFailure: recover(), then settle() again (the lost step is redone).
  /// Builds the session over `work` (no probe pass: the buckets follow the module's order reversed), with
  /// the script's batch size per rank (its DataLoader's), number of epochs and whether its sampler shuffles.
  /// A hot spare waits here until it is promoted (true) or the run ends (false: call finish()).
  bool start_loop(TorchWorkload& work, std::size_t train_size, std::size_t batch_size, int epochs,
                  bool shuffle);
  /// The previous step's end if it is still due (update(), its boundary), then what comes next: true a step
  /// (begin()), false the run is over (finish()). Idempotent until begin().
  bool settle();
  /// Begins the step settle() announced: its plan, this rank's samples (empty: none in this step; the rank
  /// runs it on any sample with weight 0), the gradient hooks armed.
  MicroBatch begin();
  /// Backward is over: the step's reduction finished (`.grad` holds the global mean). Rethrows a failure the
  /// hooks saw. InvalidArgument if no gradient at all was reported (backward() not called).
  void reduce();
  /// --shard gradients: the ranges of the flat gradients this rank holds reduced, its own shard first
  /// (train::Session::sharded_gradients); empty where the gradients are whole.
  [[nodiscard]] std::vector<Slice> sharded_gradients() const;
  /// --shard parameters: whether the parameters are sharded, and a unit's ranges gathered before it runs
  /// (collective; CommFailure) and released after (train::Session::gather_params, release_params); the
  /// next unit's gather handed over ahead of time (prefetch_params: the ticket gather_params waits for).
  [[nodiscard]] bool sharded_parameters() const;
  void gather_params(const std::vector<Slice>& ranges, std::uint64_t ticket = 0);
  std::uint64_t prefetch_params(const std::vector<Slice>& ranges);
  /// An embedding unit's forward: only the rows its indices name (train::Session::gather_rows).
  void gather_rows(Slice table, std::size_t width, const std::vector<std::int64_t>& rows);
  void release_params(const std::vector<Slice>& ranges);
  /// The step's update (the algorithm, which calls the workload's optimiser) after reduce(); `loss` is this
  /// rank's share of the step's mean loss (NaN: not known); `lr`, if not NaN, the learning rate the metrics
  /// report (a script's own optimizer's).
  void update(double loss, double lr = std::numeric_limits<double>::quiet_NaN());
  /// The step begun and not yet updated (0: none; 1 begun; 2 reduced).
  [[nodiscard]] int phase() const noexcept;
  /// This rank's samples of the step `ahead` after the next at the current size (nothing: the epoch ends).
  [[nodiscard]] std::optional<std::vector<std::size_t>> peek(std::size_t ahead);

  /// The end (the idle spares dismissed, the done event); the summary.
  train::Summary finish();
  /// The session while run() runs (e.g. for its step()).
  [[nodiscard]] train::Session* session() noexcept;

  /// Finalizes MPI (bounded: see mpi::Environment::finalize) and returns `code`.
  int exit(int code);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sinew::pytorch
