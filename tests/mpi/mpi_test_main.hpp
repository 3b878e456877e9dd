// What the mains of the multi-rank gtest programs share (mpi_main.cpp, and the tests with a main of their
// own, such as membership_test.cpp): quiet non-zero ranks, and one outcome -> exit code rule:
//   1   a test failed on any rank, or the filter matched no test (a typo in tests/mpi/CMakeLists.txt);
//   77  no failure, but a test skipped on some rank (GTEST_SKIP: no ULFM, no data set): ctest reports the
//       run as skipped (SKIP_RETURN_CODE 77 in tests/mpi/CMakeLists.txt), never as passed;
//   0   every test ran and passed on every rank.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstdio>

namespace sinew::test {

/// The exit code of a run that skipped a test (Automake's convention; SKIP_RETURN_CODE in CMake).
inline constexpr int kSkipped = 77;

/// On ranks other than 0: no result printer, only failures, prefixed with the rank.
inline void print_failures_only(int rank) {
  class RankFailurePrinter : public testing::EmptyTestEventListener {
   public:
    explicit RankFailurePrinter(int r) : rank_(r) {}
    void OnTestPartResult(const testing::TestPartResult& r) override {
      if (r.failed())
        std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name(), r.line_number(), r.summary());
    }

   private:
    int rank_;
  };
  if (rank == 0) return;
  auto& listeners = testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

/// This rank's {failed, skipped, nothing to run} after RUN_ALL_TESTS() returned `result`; the mains
/// reduce it with MPI_MAX over the ranks, then call exit_code().
inline std::array<int, 3> local_outcome(int result) {
  const auto* unit = testing::UnitTest::GetInstance();
  return {result != 0 ? 1 : 0, unit->skipped_test_count() > 0 ? 1 : 0,
          unit->test_to_run_count() == 0 ? 1 : 0};
}

/// The exit code of a reduced outcome; `why` gets a line to print (empty when every test passed).
inline int exit_code(const std::array<int, 3>& outcome, const char*& why) {
  if (outcome[0] != 0) return why = "failed", 1;
  if (outcome[2] != 0) return why = "failed: no test matched the filter, nothing was tested", 1;
  if (outcome[1] != 0) return why = "skipped (exit code 77: ctest reports a skip)", kSkipped;
  return why = "passed on every rank", 0;
}

}  // namespace sinew::test
