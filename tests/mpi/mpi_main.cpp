// main() of the multi-rank gtest programs: starts MPI, runs the tests on every rank, prints results
// from rank 0 only (plus any rank's failures), and makes every rank exit non-zero if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include "sinew/core/log.hpp"
#include "sinew/mpi/environment.hpp"

namespace {
/// Prints failures of non-zero ranks, prefixed with the rank, and nothing else.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name(), r.line_number(), r.summary());
  }

 private:
  int rank_;
};
}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  sinew::mpi::Environment env(&argc, &argv);
  sinew::log::init(env.world_rank(), env.world_size(), spdlog::level::warn);
  if (env.world_rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(env.world_rank()));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return failed;
}
