// main() of the multi-rank gtest programs: starts MPI, runs the tests on every rank, prints results
// from rank 0 only (plus any rank's failures), and gives every rank the same exit code (mpi_test_main.hpp).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

#include "mpi_test_main.hpp"
#include "sinew/core/log.hpp"
#include "sinew/mpi/environment.hpp"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  sinew::mpi::Environment env(&argc, &argv);
  sinew::log::init(env.world_rank(), env.world_size(), spdlog::level::warn);
  sinew::test::print_failures_only(env.world_rank());
  auto outcome = sinew::test::local_outcome(RUN_ALL_TESTS());
  MPI_Allreduce(MPI_IN_PLACE, outcome.data(), 3, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const char* why = "";
  const int code = sinew::test::exit_code(outcome, why);
  if (code != 0 && env.world_rank() == 0) std::fprintf(stderr, "%s\n", why);
  return code;
}
