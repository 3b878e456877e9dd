// train::ReplicatedState::synchronise over every rank of the world: after a change of membership every
// member holds the same state. With a lockstep algorithm that is the most advanced member's; after a
// failure with an algorithm whose ranks step on their own (rewind), the average of the rewound members'
// agreed states, which a newcomer (step -1, no state, no rewind of its own) takes too.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "sinew/comm/mpi/backend.hpp"
#include "sinew/data/sampler.hpp"
#include "sinew/model/workload.hpp"
#include "sinew/optim/optimizer.hpp"
#include "sinew/train/replicated_state.hpp"

using namespace sinew;

namespace {

/// One member's state: a small MLP, SGD with momentum, a sampler; element i of every tensor set to
/// `value(i)`.
struct Member {
  Member()
      : work(model::Model::build("mlp:8", model::Shape{1, 4, 4}, 3, 7),
             optim::make_optimizer(optim::OptimizerOptions{}, 4 * 4 * 8 + 8 + 8 * 3 + 3), data, data),
        sampler(1000, 7),
        state(work, sampler, 7) {}

  template <class F>
  void fill(F value) {
    for (const auto& [name, buf] : state.tensors())
      for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = value(i);
  }

  data::Dataset data;  // not read: the test fills the tensors itself
  model::ModelWorkload work;
  data::DistributedSampler sampler;
  train::ReplicatedState state;
};

float agreed_value(int rank, std::size_t i) {
  return static_cast<float>(rank + 1) + 0.001f * static_cast<float>(i % 97);
}

}  // namespace

TEST(StateSync, LockstepTakesTheMostAdvancedMember) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank();
  Member m;
  m.fill([r](std::size_t i) { return agreed_value(r, i); });
  m.state.pos().step = r == 1 ? 12 : 11;  // rank 1 got one step further
  m.state.synchronise(backend, comm::Options{});
  EXPECT_EQ(m.state.pos().step, 12);
  for (const auto& [name, buf] : m.state.tensors())
    for (std::size_t i = 0; i < buf.size(); ++i)
      ASSERT_EQ(buf[i], agreed_value(1, i)) << name << "[" << i << "]";
}

TEST(StateSync, RewoundMembersAverageTheirAgreedStatesAndANewcomerTakesIt) {
  comm::mpi::MpiBackend backend(mpi::Communicator::borrow(MPI_COMM_WORLD));
  const int r = backend.rank();
  const int n = backend.size();
  const int newcomer = n - 1;  // a spawned replacement or a promoted spare: no state of its own
  Member m;
  if (r != newcomer) {
    m.fill([r](std::size_t i) { return agreed_value(r, i); });
    m.state.pos().step = 20;
    m.state.mark_agreed();
    // Steps taken on its own after the agreement (up to the failure): rewound, not kept.
    m.fill([r](std::size_t) { return 100.f + static_cast<float>(r); });
    m.state.pos().step = 20 + r;
  } else {
    m.fill([](std::size_t) { return -5.f; });
    m.state.pos().step = -1;
  }
  m.state.synchronise(backend, comm::Options{}, /*rewind=*/r != newcomer);
  EXPECT_EQ(m.state.pos().step, 20);
  const int members = n - 1;
  for (const auto& [name, buf] : m.state.tensors()) {
    for (std::size_t i = 0; i < buf.size(); ++i) {
      float sum = 0;
      for (int k = 0; k < members; ++k) sum += agreed_value(k, i);
      ASSERT_NEAR(buf[i], sum / static_cast<float>(members), 1e-5f) << name << "[" << i << "]";
    }
  }
  // And bit for bit the same on every rank.
  std::vector<float> mine(m.work.params().begin(), m.work.params().end());
  std::vector<float> root = mine;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(mine, root);
}
