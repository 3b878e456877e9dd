// The GPU tests' main: exit 77 (ctest: skipped) when a test skipped and none failed, so that a machine
// without a GPU never reports the GPU tests as passed; 1 on a failure; 0 when every test ran and passed.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  if (result != 0) return 1;
  if (testing::UnitTest::GetInstance()->skipped_test_count() > 0) return 77;
  return 0;
}
