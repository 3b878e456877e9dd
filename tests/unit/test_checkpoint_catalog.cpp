// The checkpoint catalog: the naming scheme (one place) and what scan(), scan_partial() and find_latest()
// make of a directory. Valid checkpoints themselves are written by tests/mpi/checkpoint_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "sinew/checkpoint/catalog.hpp"

namespace fs = std::filesystem;

namespace sinew::checkpoint {
namespace {

TEST(CheckpointCatalog, NamesFollowTheDocumentedScheme) {
  EXPECT_EQ(checkpoint_name(120), "ckpt-0000000120");
  EXPECT_EQ(partial_name(120), "ckpt-0000000120.partial");
  EXPECT_EQ(shard_name(1, 4), "shard-00001-of-00004.h5");
  EXPECT_EQ(kManifestFile, "manifest.h5");
  EXPECT_EQ(kManifestChecksumFile, "manifest.h5.crc32");
  EXPECT_EQ(checkpoint_path("/d", 7), "/d/ckpt-0000000007");
  EXPECT_EQ(partial_path("/d", 7), "/d/ckpt-0000000007.partial");
}

TEST(CheckpointCatalog, StepOfAcceptsExactlyTheSchemesNames) {
  EXPECT_EQ(step_of("ckpt-0000000120"), 120);
  EXPECT_EQ(step_of(checkpoint_name(9999999999)), 9999999999);
  EXPECT_EQ(step_of("ckpt-0000000120.partial", /*partial=*/true), 120);
  for (const char* bad :
       {"", "ckpt-", "ckpt-120", "ckpt-00000001200", "ckpt-000000012x", "ckpt-0000000120.partial",
        "xckpt-0000000120", "CKPT-0000000120", "ckpt-0000000120/"}) {
    EXPECT_FALSE(step_of(bad)) << bad;
  }
  EXPECT_FALSE(step_of("ckpt-0000000120", /*partial=*/true));
  EXPECT_FALSE(step_of("ckpt-0000000120.partia", /*partial=*/true));
}

class CatalogDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sinew-catalog-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(CatalogDir, ScanListsCommittedCheckpointsNewestFirstAndIgnoresTheRest) {
  for (const std::int64_t s : {10, 30, 20}) fs::create_directories(checkpoint_path(dir_.string(), s));
  fs::create_directories(partial_path(dir_.string(), 40));
  fs::create_directories(dir_ / "ckpt-12");          // not the scheme's name
  std::ofstream(dir_ / checkpoint_name(50)) << "x";  // a file, not a directory
  const auto all = scan(dir_.string(), /*check=*/false);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 30);
  EXPECT_EQ(all[1].step, 20);
  EXPECT_EQ(all[2].step, 10);
  EXPECT_TRUE(all[0].valid);
  EXPECT_EQ(all[0].path, checkpoint_path(dir_.string(), 30));
  const auto partial = scan_partial(dir_.string());
  ASSERT_EQ(partial.size(), 1u);
  EXPECT_EQ(partial[0].step, 40);
  EXPECT_FALSE(partial[0].valid);
  EXPECT_FALSE(partial[0].reason.empty());
}

TEST_F(CatalogDir, FindLatestSkipsCheckpointsThatDoNotVerify) {
  // Empty directories named like checkpoints have no manifest: each is skipped with its reason.
  for (const std::int64_t s : {10, 20}) fs::create_directories(checkpoint_path(dir_.string(), s));
  const Latest l = find_latest(dir_.string());
  EXPECT_FALSE(l.found);
  ASSERT_EQ(l.skipped.size(), 2u);
  EXPECT_EQ(l.skipped[0].step, 20);
  EXPECT_NE(l.skipped[0].reason.find("manifest"), std::string::npos) << l.skipped[0].reason;
}

TEST(CheckpointCatalog, AMissingDirectoryHoldsNoCheckpoints) {
  EXPECT_TRUE(scan("/nonexistent/sinew-catalog", true).empty());
  EXPECT_TRUE(scan_partial("/nonexistent/sinew-catalog").empty());
  EXPECT_FALSE(find_latest("/nonexistent/sinew-catalog").found);
}

}  // namespace
}  // namespace sinew::checkpoint
