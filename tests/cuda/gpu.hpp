// What the GPU tests share: skip without a GPU, and compare float vectors with a stated tolerance.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "sinew/cuda/device.hpp"

/// Skips the current test (ctest then reports the run as skipped) when no GPU is visible.
#define SINEW_REQUIRE_GPU()                                                                      \
  do {                                                                                           \
    if (!::sinew::cuda::available()) GTEST_SKIP() << "no CUDA GPU visible (cudaGetDeviceCount)"; \
  } while (false)

namespace sinew::test {

/// Largest |x|.
inline float max_abs(std::span<const float> x) {
  float m = 0;
  for (const float v : x) m = std::max(m, std::abs(v));
  return m;
}

/// Every element: |got - want| <= rel * |want| + abs_of_max * max|want| + abs.
inline void expect_close(std::span<const float> got, std::span<const float> want, float rel, float abs_of_max,
                         float abs, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const float scale = max_abs(want);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float tol = rel * std::abs(want[i]) + abs_of_max * scale + abs;
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i] << " (tolerance "
                      << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements out of tolerance, of " << want.size();
}

}  // namespace sinew::test
