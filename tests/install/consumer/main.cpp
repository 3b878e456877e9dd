// A program outside the Sinew tree that finds an installed Sinew with find_package(Sinew) and uses it.
#include <sinew/comm/bucketer.hpp>
#include <sinew/config.hpp>
#include <sinew/train/trainer.hpp>

#include <cstdio>

int main() {
  std::printf("sinew %s (ULFM %d)\n", SINEW_VERSION, SINEW_HAVE_ULFM);
  return sinew::comm::dtype_size(sinew::comm::DType::kFloat32) == 4 ? 0 : 1;
}
