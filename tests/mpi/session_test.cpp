// train::Session driven from outside the built-in loop (the test computes forward and backward of its own
// linear model, test_support::LinearModel), over every rank of the world:
//   * the result equals one process training the whole global batch (the session's sampling, reduction
//     and update are exact);
//   * --find-unused-parameters: a parameter block that never gets a gradient is reduced as zeros, and the
//     other parameters end exactly as in a model without the block; without the option the step fails
//     with InvalidArgument naming the block.
// The kill-at-each-phase scenarios of the same driver are tests/cli/session_scenarios.sh.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../support/drive_session.hpp"
#include "../support/flat_workload.hpp"
#include "../support/linear_model.hpp"
#include "shared_temp_dir.hpp"
#include "sinew/core/error.hpp"
#include "sinew/membership/group.hpp"
#include "sinew/mpi/communicator.hpp"
#include "sinew/train/layer_options.hpp"
#include "sinew/train/session.hpp"

using namespace sinew;

namespace {

constexpr std::size_t kTrain = 96;

train::Config config(std::size_t batch) {
  train::Config c;
  c.epochs = 2;
  c.batch_size = batch;
  c.lr = 0.1f;
  c.momentum = 0;
  c.lr_schedule = "constant";
  c.warmup_steps = 0;
  c.progress = false;
  c.resume = "never";
  c.timeout_ms = 30000;  // a hang fails long before ctest's deadline
  return c;
}

/// Trains `model` over `comm` with the documented loop; returns the final parameters. `views`: the
/// workload's tensors, if not the model's.
std::vector<float> train_over(const mpi::Communicator& comm, const train::Config& c,
                              const test_support::LinearModel& model, std::vector<TensorView> views = {},
                              std::size_t micro_batches = 1) {
  const optim::OptimizerOptions oo = train::optimizer_options(c);
  test_support::FlatWorkload work(model.num_params(), oo, model.ready_order(),
                                  views.empty() ? model.views() : std::move(views));
  train::SessionParts parts;
  parts.train_size = kTrain;
  train::Session s(c, membership::Group::over(comm), work, std::move(parts));
  const train::Summary sum = test_support::drive(s, model, work, {1000, 16});
  EXPECT_EQ(sum.exit_code(), 0);
  EXPECT_EQ(sum.steps,
            static_cast<std::int64_t>(
                2 * kTrain / (micro_batches * c.batch_size * static_cast<std::size_t>(comm.size()))));
  return {work.params().begin(), work.params().end()};
}

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

TEST(Session, CallerDrivenStepsMatchOneProcessWithTheGlobalBatch) {
  const int n = world_size();
  const test_support::LinearModel model;
  const auto parallel = train_over(mpi::Communicator::borrow(MPI_COMM_WORLD), config(4), model);
  const auto alone =
      train_over(mpi::Communicator::borrow(MPI_COMM_SELF), config(4 * static_cast<std::size_t>(n)), model);
  ASSERT_EQ(parallel.size(), alone.size());
  for (std::size_t i = 0; i < parallel.size(); ++i)
    EXPECT_NEAR(parallel[i], alone[i], 1e-5f * (1.f + std::abs(alone[i]))) << "parameter " << i;
}

TEST(Session, AccumulatedMicroBatchesMatchOneProcessWithTheGlobalBatch) {
  // --global-batch larger than ranks x batch: each step is two micro-batches, accumulated by the caller
  // (its gradients, `accumulate` after the first) and reported once, in the last.
  const int n = world_size();
  const test_support::LinearModel model;
  train::Config c = config(2);
  c.global_batch = 4 * static_cast<std::size_t>(n);
  const auto parallel = train_over(mpi::Communicator::borrow(MPI_COMM_WORLD), c, model, {}, 2);
  const auto alone =
      train_over(mpi::Communicator::borrow(MPI_COMM_SELF), config(4 * static_cast<std::size_t>(n)), model);
  for (std::size_t i = 0; i < parallel.size(); ++i)
    EXPECT_NEAR(parallel[i], alone[i], 1e-5f * (1.f + std::abs(alone[i]))) << "parameter " << i;
}

TEST(Session, UnusedParametersAreReducedAsZerosWithTheOption) {
  test_support::LinearModel with;
  with.unused = true;
  for (const bool overlap : {true, false}) {  // buckets reduced on the communication thread, or at the end
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    train::Config c = config(4);
    c.overlap = overlap;
    c.find_unused_parameters = true;
    const auto a = train_over(mpi::Communicator::borrow(MPI_COMM_WORLD), c, with);
    const auto b =
        train_over(mpi::Communicator::borrow(MPI_COMM_WORLD), config(4), test_support::LinearModel{});
    ASSERT_EQ(a.size(), b.size() + 3);
    for (std::size_t i = 0; i < b.size(); ++i) EXPECT_EQ(a[i], b[i]) << "parameter " << i;
    // Zero gradients with plain SGD: the block never moves from its initial zeros.
    for (std::size_t i = b.size(); i < a.size(); ++i) EXPECT_EQ(a[i], 0.f) << "unused parameter " << i;
  }
}

TEST(Session, AnUnreportedRangeWithoutTheOptionFailsNamingIt) {
  test_support::LinearModel with;
  with.unused = true;
  try {
    (void)train_over(mpi::Communicator::borrow(MPI_COMM_WORLD), config(4), with);
    ADD_FAILURE() << "a step without the unused block's gradient was accepted";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unused/u"), std::string::npos) << m;
    EXPECT_NE(m.find("--find-unused-parameters"), std::string::npos) << m;
    EXPECT_NE(m.find("step 1"), std::string::npos) << m;
  }
}

TEST(Session, ACheckpointOfAnotherModelOfTheSameSizeIsRefusedAndKept) {
  test::SharedTempDir dir(MPI_COMM_WORLD);
  const auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  train::Config c = config(4);
  c.checkpoint_dir = dir.path();
  (void)train_over(world, c, test_support::LinearModel{});  // writes the end checkpoint
  const auto before = std::filesystem::last_write_time(dir.path());
  c.resume = "auto";
  // The same sizes, other tensors: 7 parameters as one "w" of 7 instead of a weight of 6 and a bias.
  const std::vector<TensorView> other = {{"w", "params", 0, {7}, ""}};
  try {
    (void)train_over(world, c, test_support::LinearModel{}, other);
    ADD_FAILURE() << "a checkpoint of another model was loaded";
  } catch (const CheckpointError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("another model"), std::string::npos) << m;
    EXPECT_NE(m.find("'w'"), std::string::npos) << m;
  }
  EXPECT_EQ(std::filesystem::last_write_time(dir.path()), before) << "the checkpoint directory changed";
  // And the model it was written for resumes from it (the end of the run: nothing left to train).
  EXPECT_NO_THROW((void)train_over(world, c, test_support::LinearModel{}));
}
