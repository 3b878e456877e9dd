// Resuming from checkpoints: the continued run equals the uninterrupted one, and resuming at other
// world sizes (4 -> 2 -> 3) restores exactly the saved state and uses every sample once per epoch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <filesystem>

#include "shared_temp_dir.hpp"
#include "sinew/checkpoint/catalog.hpp"
#include "sinew/checkpoint/reader.hpp"
#include "sinew/core/error.hpp"
#include "sinew/model/workload.hpp"
#include "sinew/train/trainer.hpp"

using namespace sinew;
namespace fs = std::filesystem;

namespace {
using sinew::test::SharedTempDir;

train::Config config(const std::string& dir) {
  train::Config c;
  c.dataset = "synthetic";
  c.model = "mlp:32";
  c.limit_train = 300;
  c.limit_test = 100;
  c.batch_size = 8;
  c.epochs = 2;
  c.optimizer = "adam";  // state with moments and a step count: the hardest to restore
  c.lr = 0.01f;
  c.lr_schedule = "constant";
  c.warmup_steps = 0;
  c.progress = false;
  c.checkpoint_dir = dir;
  return c;
}

std::vector<float> params_of(train::Trainer& t) {
  auto p = t.workload().params();
  return {p.begin(), p.end()};
}
}  // namespace

TEST(Resume, ContinuedRunEqualsUninterruptedRun) {
  auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  SharedTempDir a(MPI_COMM_WORLD), b(MPI_COMM_WORLD);
  train::Config c = config(a.path());
  c.max_steps = 14;  // crosses the epoch boundary (300 samples / (W * 8) steps per epoch)
  train::Trainer full(c, world, model::make_workload);
  const auto s_full = full.run();

  train::Config first = config(b.path());
  first.max_steps = 5;
  train::Trainer(first, world, model::make_workload).run();
  train::Config rest = config(b.path());
  rest.max_steps = 14;
  train::Trainer resumed(rest, world, model::make_workload);
  const auto s_rest = resumed.run();

  EXPECT_EQ(s_rest.steps, s_full.steps);
  const auto pa = params_of(full), pb = params_of(resumed);
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) ASSERT_EQ(pa[i], pb[i]) << "parameter " << i;
  // The last checkpoints of both runs hold the same state too.
  const auto ka = checkpoint::load(checkpoint::find_latest(a.path()).found->path);
  const auto kb = checkpoint::load(checkpoint::find_latest(b.path()).found->path);
  EXPECT_EQ(ka.tensors, kb.tensors);
  EXPECT_EQ(ka.cursor, kb.cursor);
  EXPECT_EQ(ka.optimizer_steps, kb.optimizer_steps);
}

// Two runs of one configuration give bit-identical weights: the precondition of exact resume.
TEST(Resume, SameConfigurationGivesIdenticalWeights) {
  auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  SharedTempDir a(MPI_COMM_WORLD), b(MPI_COMM_WORLD);
  train::Config c = config(a.path());
  c.max_steps = 14;
  train::Trainer t1(c, world, model::make_workload);
  t1.run();
  c.checkpoint_dir = b.path();
  train::Trainer t2(c, world, model::make_workload);
  t2.run();
  EXPECT_EQ(params_of(t1), params_of(t2));
}

TEST(Resume, FourThenTwoThenThreeRanks) {
  int wr = 0, wn = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &wn);
  if (wn != 4) GTEST_SKIP() << "the 4 -> 2 -> 3 scenario runs with 4 ranks";
  SharedTempDir dir(MPI_COMM_WORLD);
  train::Config c = config(dir.path());
  c.epochs = 1;
  std::int64_t samples = 0;

  // Phase 1: 4 ranks, 6 steps x 32 samples.
  c.max_steps = 6;
  std::vector<float> after1;
  {
    train::Trainer t(c, mpi::Communicator::borrow(MPI_COMM_WORLD), model::make_workload);
    samples += t.run().samples;
    after1 = params_of(t);
  }
  // Phase 2: ranks 0 and 1 resume the 4-rank checkpoint; 6 more steps x 16 samples.
  MPI_Comm two = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, wr < 2 ? 0 : MPI_UNDEFINED, wr, &two);
  std::int64_t phase2_samples = 0;
  if (two != MPI_COMM_NULL) {
    c.max_steps = 12;
    train::Trainer t(c, mpi::Communicator(two), model::make_workload);
    EXPECT_EQ(params_of(t), after1) << "state restored at 2 ranks differs from what 4 ranks saved";
    phase2_samples = t.run().samples;
  }
  MPI_Bcast(&phase2_samples, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  samples += phase2_samples;
  const auto saved2 = checkpoint::load(checkpoint::find_latest(dir.path()).found->path);
  EXPECT_EQ(saved2.world_size, 2);
  EXPECT_EQ(saved2.step, 12);
  // Phase 3: ranks 0..2 resume the 2-rank checkpoint and finish the epoch (the remaining 12 samples).
  MPI_Comm three = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, wr < 3 ? 0 : MPI_UNDEFINED, wr, &three);
  std::int64_t phase3_samples = 0;
  if (three != MPI_COMM_NULL) {
    c.max_steps = 0;
    train::Trainer t(c, mpi::Communicator(three), model::make_workload);
    EXPECT_EQ(params_of(t), saved2.tensors.at("params"))
        << "state restored at 3 ranks differs from the saved one";
    phase3_samples = t.run().samples;
  }
  MPI_Bcast(&phase3_samples, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  samples += phase3_samples;
  // Every sample of the epoch was used exactly once over the three phases (the sampler hands out each
  // position of the epoch's permutation once; its tests check the permutation itself).
  EXPECT_EQ(samples, 300);
  const auto final_state = checkpoint::load(checkpoint::find_latest(dir.path()).found->path);
  EXPECT_EQ(final_state.cursor, 300u);
  EXPECT_EQ(final_state.world_size, 3);
}

TEST(Resume, MismatchedModelIsACheckpointError) {
  auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  SharedTempDir dir(MPI_COMM_WORLD);
  train::Config c = config(dir.path());
  c.max_steps = 2;
  train::Trainer(c, world, model::make_workload).run();
  c.model = "mlp:16";
  EXPECT_THROW(train::Trainer(c, world, model::make_workload), CheckpointError);
  c.model = "mlp:32";
  c.resume = dir.path() + "/ckpt-0000009999";
  EXPECT_THROW(train::Trainer(c, world, model::make_workload), CheckpointError);
  c.resume = "never";
  c.checkpoint_dir = dir.path();
  train::Trainer fresh(c, world, model::make_workload);  // ignores the existing checkpoints
  EXPECT_EQ(fresh.run().steps, 2);
}

TEST(Resume, AsyncCheckpointsEqualSynchronousOnes) {
  auto world = mpi::Communicator::borrow(MPI_COMM_WORLD);
  SharedTempDir a(MPI_COMM_WORLD), b(MPI_COMM_WORLD);
  train::Config c = config(a.path());
  c.max_steps = 14;
  c.checkpoint_every = 3;
  c.checkpoint_keep = 0;
  const auto s_sync = train::Trainer(c, world, model::make_workload).run();
  c.checkpoint_dir = b.path();
  c.checkpoint_async = true;
  const auto s_async = train::Trainer(c, world, model::make_workload).run();
  EXPECT_TRUE(s_sync.checkpoint_error.empty());
  EXPECT_TRUE(s_async.checkpoint_error.empty());
  const auto ea = checkpoint::scan(a.path(), true), eb = checkpoint::scan(b.path(), true);
  ASSERT_EQ(ea.size(), eb.size());
  ASSERT_EQ(ea.size(), 5u);  // steps 3, 6, 9, 12 and the end (14)
  for (std::size_t i = 0; i < ea.size(); ++i) {
    EXPECT_TRUE(eb[i].valid) << eb[i].reason;
    EXPECT_EQ(ea[i].step, eb[i].step);
    EXPECT_EQ(checkpoint::load(ea[i].path).tensors, checkpoint::load(eb[i].path).tensors) << ea[i].path;
  }
}
