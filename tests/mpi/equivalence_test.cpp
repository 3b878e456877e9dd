// Data parallelism is exact: N ranks x batch b give the same weights as 1 rank x batch N*b after k steps.
#include <gtest/gtest.h>

#include "sinew/model/workload.hpp"
#include "sinew/train/trainer.hpp"

using namespace sinew;

namespace {
train::Config base_config() {
  train::Config c;
  c.dataset = "synthetic";
  c.model = "mlp:32,16";
  c.epochs = 2;
  c.max_steps = 40;
  // 205 samples: each epoch ends with a short step that splits unevenly over the ranks (e.g. 4,3,3,3),
  // and the run crosses into the second epoch's new permutation.
  c.limit_train = 205;
  c.limit_test = 200;
  c.lr = 0.05f;
  c.momentum = 0.9f;
  c.lr_schedule = "constant";
  c.warmup_steps = 0;
  c.progress = false;
  c.seed = 7;
  c.bucket_mb = 0.001;  // many buckets
  return c;
}

void expect_same_as_single_rank(const std::string& optimizer, const std::string& model) {
  auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  const int n = world.size();
  train::Config c = base_config();
  c.optimizer = optimizer;
  c.model = model;
  if (optimizer == "adam") c.lr = 0.005f;
  c.batch_size = 8;
  train::Trainer parallel(c, world, model::make_workload);
  parallel.run();
  if (world.rank() != 0) return;
  train::Config single = c;
  single.batch_size = 8 * static_cast<std::size_t>(n);
  train::Trainer alone(single, mpi::Communicator::borrow(MPI_COMM_SELF), model::make_workload);
  alone.run();
  const auto a = parallel.workload().params();
  const auto b = alone.workload().params();
  ASSERT_EQ(a.size(), b.size());
  float max_diff = 0, max_abs = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_abs = std::max(max_abs, std::abs(b[i]));
  }
  // Only the summation order differs (per-rank partial sums, then the allreduce).
  EXPECT_LT(max_diff, 1e-4f * std::max(1.f, max_abs)) << "max |w_parallel - w_single| after the run";
  // And training did move the weights: the comparison is not vacuous.
  auto initial = model::Model::build(c.model, {1, 8, 8}, 10, c.seed);
  float moved = 0;
  for (std::size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(a[i] - initial.params()[i]));
  EXPECT_GT(moved, 1e-3f);
}
}  // namespace

TEST(Equivalence, SgdMomentumMlpMatchesSingleRank) { expect_same_as_single_rank("sgd", "mlp:32,16"); }
TEST(Equivalence, AdamMatchesSingleRank) { expect_same_as_single_rank("adam", "mlp:32,16"); }
TEST(Equivalence, CnnMatchesSingleRank) { expect_same_as_single_rank("sgd", "cnn"); }
