// main() of the multi-rank gtest programs: starts MPI, runs the tests on every rank, prints results
// from rank 0 only (plus any rank's failures), and gives every rank the same exit code:
//   1   a test failed on any rank, or the filter matched no test (a typo in tests/mpi/CMakeLists.txt);
//   77  no failure, but a test skipped on some rank (GTEST_SKIP: no ULFM, no data set): ctest reports the
//       run as skipped (SKIP_RETURN_CODE 77 in tests/mpi/CMakeLists.txt), never as passed;
//   0   every test ran and passed on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "sinew/core/log.hpp"
#include "sinew/mpi/environment.hpp"

namespace {
/// The exit code of a run that skipped a test (Automake's convention; SKIP_RETURN_CODE in CMake).
constexpr int kSkipped = 77;

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
  const int result = RUN_ALL_TESTS();
  const auto* unit = testing::UnitTest::GetInstance();
  // {failed, skipped, none to run}, each the maximum over ranks.
  int outcome[3] = {result != 0 ? 1 : 0, unit->skipped_test_count() > 0 ? 1 : 0,
                    unit->test_to_run_count() == 0 ? 1 : 0};
  MPI_Allreduce(MPI_IN_PLACE, outcome, 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (outcome[0] != 0) return 1;
  if (outcome[2] != 0) {
    if (env.world_rank() == 0) std::fprintf(stderr, "no test matched the filter: nothing was tested\n");
    return 1;
  }
  if (outcome[1] != 0) {
    if (env.world_rank() == 0)
      std::fprintf(stderr, "%d of %d tests skipped on rank 0 (exit code 77: ctest reports a skip)\n",
                   unit->skipped_test_count(), unit->test_to_run_count());
    return kSkipped;
  }
  return 0;
}
