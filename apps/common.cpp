#include "common.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "sinew/core/error.hpp"

namespace sinew::apps {

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

int guarded_main(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    // Usage errors are the same on every rank: one line is enough. Other errors may be rank-specific.
    if (e.exit_code() != ExitCode::kUsage || launcher_rank() == 0) {
      std::fprintf(stderr, "sinew: error: %s\n", e.message().c_str());
      std::fflush(stderr);
    }
    return static_cast<int>(e.exit_code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sinew: error: %s\n", e.what());
    return static_cast<int>(ExitCode::kFailure);
  }
}

}  // namespace sinew::apps
